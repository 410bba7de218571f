"""Run-scoped sessions: one Slurm allocation (and one Ray cluster) shared by a run's steps.

See :mod:`dagster_slurm.session.session` for how processes agree on the allocation,
:mod:`dagster_slurm.session.frontend.lifecycle` for teardown and :mod:`dagster_slurm.session.orphans.search`
for the orphan sensor.
"""
