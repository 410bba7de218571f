"""The Dagster-facing layer: ``SlurmSessionResource``, which run sessions a process uses
and when teardown ends them, run-scope ``compute.run`` (a job step in the run's
allocation) and the reattachment of a retried step.
"""
