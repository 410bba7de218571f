"""What asset scope (:mod:`dagster_slurm.compute`) and run scope (:mod:`dagster_slurm.session`)
share about one job or step: invocation paths (:mod:`~dagster_slurm.jobs.paths`), outcomes
and typed errors (:mod:`~dagster_slurm.jobs.errors`, :mod:`~dagster_slurm.jobs.outcome`),
pending-reason policy (:mod:`~dagster_slurm.jobs.pending`), cancellation
(:mod:`~dagster_slurm.jobs.cancel`), log and output lines (:mod:`~dagster_slurm.jobs.logs`),
the drain signal (:mod:`~dagster_slurm.jobs.signals`), invocation files
(:mod:`~dagster_slurm.jobs.files`), job figures (:mod:`~dagster_slurm.jobs.metrics`), the
environment's activation (:mod:`~dagster_slurm.jobs.activation`) and the runner template
(:mod:`~dagster_slurm.jobs.runner`).

This layer sits below both scopes and imports neither (see "Layers" in ``docs/design.md``).
"""
