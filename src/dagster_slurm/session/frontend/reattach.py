"""Reattachment: whether a run-scope ``compute.run`` starts a fresh invocation or attaches to
the one an earlier attempt of the same step started (the record format and the decision are
pure; the runner does the reading and writing).

A step process that is killed (SIGKILL, out of memory) leaves its payload running in the
run's allocation. When Dagster retries the step in the same run (an op ``RetryPolicy``: the
multiprocess executor retries a crashed step process), the retried attempt must not start a
second payload. So every run-scope call is identified by ``(step key, call index)``: the
index counts the ``compute.run`` calls of one attempt of the step in this process (0 for the
first), so the retried attempt's first call is matched with the killed attempt's first call,
and a step that calls ``compute.run`` twice gets two invocations.

The call's record (:class:`CallRecord`, a small JSON file ``jobs/<job id>/calls/<step>/<index>.json``
in the allocation's directory) is written in the round trip that requests the step, right
after the request; it names the invocation and the request. The record exists while the
invocation's outcome is unread: the attempt that reads the outcome removes it (consumes the
call; with the invocation's files when they go) before it returns or raises, and an attempt
that stops waiting for another reason (an error, run termination) cancels the step and
removes the record in one round trip, the cancel first. A later call with the same key then
finds no record and starts afresh; a record that is still there (its process died) is
attached to.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

#: Version of the record's JSON; a record of another version is not read (an error).
RECORD_VERSION = 1


@dataclass(frozen=True)
class CallRecord:
    """What the cluster knows about one call ``(step key, index)`` of a run session.

    ``job_id``: the allocation the invocation was requested in. ``invocation``: the
    invocation's directory name (under ``jobs/<job id>/steps/<step>/``). ``request_id`` and
    ``step_name``: the step server's request and the Slurm step name. ``payload``: what the
    call runs (see :func:`payload_fingerprint`).
    """

    job_id: str
    invocation: str
    request_id: str
    step_name: str
    payload: str

    def to_json(self) -> str:
        return json.dumps({
            "version": RECORD_VERSION, "job_id": self.job_id, "invocation": self.invocation,
            "request_id": self.request_id, "step_name": self.step_name, "payload": self.payload,
        }, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CallRecord:
        """The record in ``text``; ValueError (saying what is wrong) when it is not one."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(raw, dict) or raw.get("version") != RECORD_VERSION:
            raise ValueError(f"not a call record of version {RECORD_VERSION}")
        fields = ("job_id", "invocation", "request_id", "step_name", "payload")
        missing = [name for name in fields if not isinstance(raw.get(name), str) or not raw[name]]
        if missing:
            raise ValueError(f"fields missing or not strings: {missing}")
        return cls(*(raw[name] for name in fields))


@dataclass(frozen=True)
class Attach:
    """Attach to ``record``'s invocation (it runs, or has ended and nobody read its outcome)."""

    record: CallRecord
    reason: str


@dataclass(frozen=True)
class Fresh:
    """Start a fresh invocation. ``reason`` says why; ``warning`` is True when a recorded
    invocation that may still run is left alone (the call now runs another payload)."""

    reason: str
    warning: bool = False


def decide(record: CallRecord | None, *, job_id: str, payload: str) -> Attach | Fresh:
    """Attach or start fresh, for a call whose record (None: none) was read from allocation
    ``job_id``, the run's current allocation, and which runs ``payload``.

    A record exists only while its invocation's outcome is unread (see the module
    docstring). One of the same allocation and the same payload is attached to, whether its
    step still runs or has ended: waiting on its status file decides, and an allocation that
    ended meanwhile raises ``SlurmAllocationEnded`` there.
    """
    if record is None:
        return Fresh("no earlier attempt of this call left an invocation whose outcome is unread")
    if record.job_id != job_id:
        return Fresh(f"the recorded invocation was requested in allocation {record.job_id}, "
                     f"not in the current one ({job_id})")
    if record.payload != payload:
        return Fresh(f"invocation {record.invocation} of an earlier attempt runs another payload "
                     f"({record.payload!r}, this call: {payload!r}); it is left alone", warning=True)
    return Attach(record, f"invocation {record.invocation} (step {record.step_name}, request "
                          f"{record.request_id}) was started by an earlier attempt and its "
                          f"outcome was not read")


def payload_fingerprint(payload_path: str, launcher: Any) -> str:
    """What a call runs, to compare a retried call with the recorded one: the payload path
    as given and the launcher's class (settings that may differ per attempt, such as
    environment variables, are not part of it)."""
    return f"{type(launcher).__name__}:{payload_path}"


class CallCounter:
    """Numbers the run-scope calls of each attempt of a step in this process (thread-safe).

    :meth:`next` returns 0 for an attempt's first call, 1 for its second, and so on; an
    attempt is ``(run id, step key, retry number)``, so a retried attempt (in this process or
    another) counts from 0 again. Calls made concurrently from several threads of one step
    are numbered in the order they arrive, which a retry may not repeat: such calls should
    run distinct payloads (the recorded payload is compared before attaching).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[tuple[int, str, str, int], int] = {}

    def next(self, run_id: str, step_key: str, attempt: int) -> int:
        key = (os.getpid(), run_id, step_key, attempt)
        with self._lock:
            index = self._next.get(key, 0)
            self._next[key] = index + 1
            return index


#: The process's counter of run-scope calls.
CALLS = CallCounter()


def attempt_of(context: Any) -> int:
    """The retry number of the context's step (0 for its first attempt)."""
    return int(context.get_step_execution_context().previous_attempt_count)
