"""Worker allocations: Slurm jobs whose nodes join the run's Ray cluster. Submitting and
waiting for them, removing and listing them, settling lost submissions, their batch script,
and keeping one for a run laid out with worker allocations. Builds on
:mod:`~dagster_slurm.session.head` (a worker joins the head; removing the allocation that
hosts the head elects another).
"""
