"""The relay loop: carry one asset's work units over as many allocations as it takes.

The library provides the mechanism (``submit_successor``, ``request_drain``,
``SlurmStepDrained``, ``promote_successor``); everything in this module is policy, the
application's to choose and change:

* :class:`RelayPolicy` and :class:`Watch`: while a payload runs, read the allocation's live
  ``end_time`` and queue the successor when the end is near (and, optionally, request the
  drain at a time of our choosing instead of waiting for Slurm's pre-walltime signal);
* :func:`run_relay`: run the payload, decide from its completion report whether work
  remains, hand over to the successor (``promote_successor(wait=...)``) and run it again.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import dagster as dg

from dagster_slurm import (
    ComputeResource,
    JobState,
    RunSession,
    SlurmAllocation,
    SlurmRunAllocationConfig,
    SlurmStepDrained,
)


@dataclass(frozen=True)
class RelayPolicy:
    """When to queue the successor and when to drain, in seconds before the allocation's
    end as the scheduler sees it now (``end_time``).

    ``successor_lead``: queue the successor once the end is this close (long enough for it
    to get through the queue). ``drain_lead``: request the drain once the end is this close;
    None leaves the drain to Slurm's pre-walltime signal (``signal_before_timeout``).
    ``successor_time_limit``: the successor's walltime (None: the current allocation's).
    ``check_interval``: seconds between two looks at ``end_time`` (each one is an squeue).
    ``start_timeout``: how long to wait for the successor to start after a drain.
    ``cluster_timezone``: the IANA name of the cluster's timezone, in which Slurm prints
    ``end_time`` (None: the same as this machine's).
    """

    successor_lead: float = 3600.0
    drain_lead: float | None = None
    successor_time_limit: str | None = None
    check_interval: float = 30.0
    start_timeout: float = 6 * 3600.0
    cluster_timezone: str | None = None

    def successor_config(self) -> SlurmRunAllocationConfig:
        """The successor's configuration: fields left unset inherit the current allocation's."""
        if self.successor_time_limit is None:
            return SlurmRunAllocationConfig()
        return SlurmRunAllocationConfig(time_limit=self.successor_time_limit)

    def seconds_left(self, end_time: str | None, now: datetime | None = None) -> float | None:
        """Seconds until ``end_time`` (as ``SlurmAllocation.query_end_time()`` gives it); None when
        the scheduler gave none (then nothing is decided this time round)."""
        if not end_time:
            return None
        zone = ZoneInfo(self.cluster_timezone) if self.cluster_timezone else None
        end = datetime.fromisoformat(end_time)
        end = end.replace(tzinfo=zone) if zone else end.astimezone()
        return (end - (now or datetime.now(end.tzinfo))).total_seconds()


class Watch(threading.Thread):
    """Applies the policy to one allocation while its payload runs (a daemon thread).

    ``successor`` is the one already queued (None: none yet); after :meth:`stop` it is the
    one queued by then, and ``drain_requested_with`` is the successor's state when the
    drain was requested (None: no drain was requested here).
    """

    def __init__(self, session: RunSession, allocation: SlurmAllocation, policy: RelayPolicy,
                 successor: Any, log: Any) -> None:
        super().__init__(name=f"relay-watch-{allocation.job_id}", daemon=True)
        self.session, self.allocation, self.policy, self.log = session, allocation, policy, log
        self.successor = successor
        self.drain_requested_with: JobState | None = None
        self._drain_requested = False
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - a failed look is retried next interval
                self.log.warning(f"relay policy: {type(exc).__name__}: {exc}")
            self._stopped.wait(self.policy.check_interval)

    def check(self) -> None:
        """One look at the allocation's end time, and what the policy makes of it."""
        left = self.policy.seconds_left(self.allocation.query_end_time())
        if left is None:
            return  # an unknown end decides nothing; Slurm's own signal still comes
        if self.successor is None and left <= self.policy.successor_lead:
            self.successor = self.session.submit_successor(self.policy.successor_config(),
                                                            logger=self.log)
            self.log.info(f"{left:.0f} s left in {self.allocation.job_id}: queued successor "
                          f"{self.successor.job_id}")
        lead = self.policy.drain_lead
        if lead is not None and not self._drain_requested and left <= lead:
            state = self.successor.state() if self.successor is not None else None
            self.allocation.request_drain()
            self._drain_requested, self.drain_requested_with = True, state
            self.log.info(f"{left:.0f} s left in {self.allocation.job_id}: drain requested "
                          f"(successor {state.value if state else 'not queued'})")

    def stop(self) -> Any:
        """Stop watching; the successor queued by now (None: none)."""
        self._stopped.set()
        self.join()
        return self.successor


def completion_report(reports: Sequence[Any]) -> Mapping[str, Any] | None:
    """The payload's last ``{"remaining": ...}`` report; None when it sent none (a payload
    drained before it started, or one that broke off: exit code 0 proves nothing)."""
    found = [r for r in reports if isinstance(r, Mapping) and "remaining" in r]
    return found[-1] if found else None


@dataclass
class RelayOutcome:
    """What the relay did: one entry per payload run (``rounds``), each with the allocation,
    whether it drained, its exit code, the units it committed and, when the drain was
    requested here, the successor's state at that moment."""

    rounds: list[dict[str, Any]] = field(default_factory=list)

    def committed_by_allocation(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self.rounds:
            counts[entry["allocation"]] = counts.get(entry["allocation"], 0) + len(entry["units"])
        return counts


def run_payload(context: dg.AssetExecutionContext, compute: ComputeResource, payload: str,
                extras: Mapping[str, Any], watch: Watch | None) -> tuple[Any, SlurmStepDrained | None]:
    """One ``compute.run`` of the payload while ``watch`` (None: none) applies the policy;
    the completed invocation, and the drain (None: the payload was not drained)."""
    if watch is not None:
        watch.start()
    try:
        signal = watch.allocation.drain_signal if watch is not None else "TERM"
        invocation = compute.run(context=context, payload_path=payload, extras=dict(extras),
                                 extra_env={"DRAIN_SIGNAL": signal}, defer_cleanup=True)
        return invocation, None
    except SlurmStepDrained as drained:  # exit code 0 too: a drain is never a success
        return drained.invocation, drained
    finally:
        if watch is not None:
            watch.stop()


def round_entry(allocation: SlurmAllocation | None, drained: SlurmStepDrained | None,
                reports: Sequence[Any], watch: Watch | None) -> dict[str, Any]:
    """What one payload run did, for the asset's metadata."""
    report = completion_report(reports)
    units = [r for r in reports if isinstance(r, Mapping) and "unit" in r]
    requested = watch.drain_requested_with if watch is not None else None
    return {
        "allocation": allocation.job_id if allocation is not None else "local",
        "drained": drained is not None,
        "exit_code": drained.result.exit_code if drained is not None else 0,
        "units": [r["unit"] for r in units if not r.get("duplicate")],
        "duplicates": [r["unit"] for r in units if r.get("duplicate")],
        "remaining": None if report is None else report["remaining"],
        "successor_at_drain": requested.value if requested is not None else None,
    }


def run_relay(context: dg.AssetExecutionContext, compute: ComputeResource, payload: str,
              extras: Mapping[str, Any], policy: RelayPolicy, max_rounds: int = 10) -> RelayOutcome:
    """Run ``payload`` until its completion report says no unit remains, in the run's
    allocation and its successors. Raises when work remains after ``max_rounds`` payload
    runs, or when a payload that was not drained ends without reporting completion."""
    outcome = RelayOutcome()
    # Local mode has no walltime to carry past: one payload run does all the units.
    session = None if compute.mode == "local" else compute.get_run_allocation_session(context)
    successor = None
    for _round in range(max_rounds):
        allocation = session.ensure() if session is not None else None
        watch = None
        if session is not None and allocation is not None:
            watch = Watch(session, allocation, policy, successor, context.log)
        invocation, drained = run_payload(context, compute, payload, extras, watch)
        successor = watch.successor if watch is not None else None
        reports = invocation.get_custom_messages()
        outcome.rounds.append(round_entry(allocation, drained, reports, watch))
        report = completion_report(reports)
        if report is not None and report["remaining"] == 0:
            compute.cleanup_deferred_run_dir(context)  # every round's files, drained ones too
            return outcome
        if drained is None or session is None or allocation is None:
            raise RuntimeError(f"the payload ended with exit code 0 but reported "
                               f"{report or 'no completion'}; its files are kept")
        context.log.info(f"Allocation {allocation.job_id} drained; remaining units: "
                         f"{report['remaining'] if report else 'not reported'}")
        if successor is None:  # drained before the policy queued one
            successor = session.submit_successor(policy.successor_config(), logger=context.log)
        # Waits for the successor to run (releasing the drained allocation, whose nodes it
        # may need), starts it and makes it the session's allocation.
        session.promote_successor(wait=policy.start_timeout, logger=context.log)
        successor = None
    raise RuntimeError(f"work remains after {max_rounds} payload runs; re-execute the run "
                       "to continue from the committed units")
