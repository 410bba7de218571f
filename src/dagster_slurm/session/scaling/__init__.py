"""The scaling hooks: worker intents, one observation of the session (``inspect``), the
pure reconcile planner and its I/O (``reconcile_workers``), and start estimates for
candidate worker allocations.
"""
