"""The run's head allocation: acquiring it (attach or submit), successors and their
hand-over, the election of a new head (``replace_head``), a worker allocation hosting the
head, the run tag, and the separate-head layout. Depends on :mod:`~dagster_slurm.session.core`
only.
"""
