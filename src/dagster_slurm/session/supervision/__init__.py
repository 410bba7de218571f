"""Supervision: the head watch, the one place that combines head and worker state (it
replaces a head that went away and keeps the run's worker allocations).
"""
