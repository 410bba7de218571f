"""Talking to the scheduler through the cluster-side agent: submission, status, cancellation."""
