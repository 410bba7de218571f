"""A project in the style of the published dagster-slurm 1.x example: asset modules that take
``SlurmRunConfig`` and hand it to ``compute.run``, and a resources module that picks local or
Slurm resources from ``DAGSTER_DEPLOYMENT``. Written against the published API and changed
only where ``docs/migration.md`` says so (each change is marked ``Migration:``)."""
