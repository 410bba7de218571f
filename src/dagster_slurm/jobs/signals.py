"""The drain signal of a job, from the queue's ``signal_before_timeout`` setting (pure)."""

from __future__ import annotations


def drain_signal_of(signal_before_timeout: str | None) -> str | None:
    """The signal name of a ``signal_before_timeout`` spec such as ``USR1@60`` or
    ``B:TERM@120`` (``USR1``, ``TERM``); None when the spec is unset or names no signal
    (the job script then drains on TERM)."""
    if not signal_before_timeout:
        return None
    return signal_before_timeout.split(":")[-1].split("@")[0] or None
