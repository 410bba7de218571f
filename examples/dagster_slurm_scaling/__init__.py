"""Scaling a run's worker allocations from the application: two workloads, two policies."""
