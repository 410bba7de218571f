"""The narrow core every feature of a run session receives.

:class:`~dagster_slurm.session.core.context.SessionContext` carries the session's
collaborators (store/io, scheduler, paths, job name, configurations, launcher, clock, sleep,
the run follower) and the operations features share (pause while following the run, retire
a record, cancel quietly or by token, log tail).
:class:`~dagster_slurm.session.core.current.CurrentAllocation` is the only writer of the
process's current allocation and of the closed flag.
:func:`~dagster_slurm.session.core.submission.guarded_submit` is the one submission path of
heads, successors and worker allocations. The rest is what they share: configurations,
paths, errors, the cluster I/O (one SSH round trip per call), ``SlurmAllocation`` and the
wait until an allocation accepts steps. Nothing here imports a feature package.
"""
