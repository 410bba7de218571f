"""Waiting for a free slot when Slurm refuses a submission for a limit on queued jobs.

A refusal for ``MaxSubmitJobs`` and its kin (:mod:`dagster_slurm.slurm.submit_limits`) is
not a failure: one of the user's jobs ends, and the same submission is accepted. While the
submission waits, :func:`wait_for_slot`

* says in words what it waits for, with the numbers read in one extra round trip (the
  limit from ``sacctmgr``, the user's queued jobs from ``squeue``), at once and then at
  most every ``log_interval`` seconds or when the numbers change;
* sleeps with the library's :class:`~dagster_slurm.backoff.PollBackoff`, calling ``check``
  at least every second: it raises when the run the submission belongs to has ended,
  which ends the wait with nothing submitted;
* submits again, until sbatch accepts the job, or ``timeout`` seconds after the first
  refusal raise :class:`~dagster_slurm.errors.SubmitLimitTimeout` naming the limit and the
  field ``submit_limit_timeout``. A limit of 0 can never be met and fails at once.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from dagster_slurm.agent import AgentClient, AgentOpError, exec_op
from dagster_slurm.backoff import PollBackoff, sleep_checking
from dagster_slurm.errors import SchedulerError, SubmitLimitReached, SubmitLimitTimeout
from dagster_slurm.slurm.submit_limits import (
    LimitReading,
    RefusalKind,
    SubmitRefusal,
    classify_refusal,
    describe_wait,
    never_fits,
    parse_limits,
    submit_limit_argvs,
)

T = TypeVar("T")

#: The field of :class:`~dagster_slurm.resources.slurm.SlurmResource` that bounds the wait.
TIMEOUT_FIELD = "submit_limit_timeout"


@dataclass(frozen=True)
class LimitWait:
    """How a submission waits for a slot: ``emit`` receives the log lines, ``check`` is
    called at least every ``check_interval`` seconds and raises to stop waiting (the run
    ended; None: never stops), ``timeout`` bounds the wait in seconds (None: for ever).
    The retries back off from ``initial`` to ``maximum`` seconds."""

    emit: Callable[[str], None]
    check: Callable[[], None] | None = None
    timeout: float | None = None
    initial: float = 2.0
    maximum: float = 30.0
    log_interval: float = 60.0
    check_interval: float = 1.0


def wait_for_slot(
    first: SubmitLimitReached,
    wait: LimitWait,
    *,
    submit: Callable[[], T],
    read_limit: Callable[[SubmitRefusal], tuple[LimitReading | None, str]],
    what: str,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Submit again (``submit``, raising :class:`SubmitLimitReached` while refused) until
    it is accepted; see the module docstring. ``read_limit`` is the extra round trip: the
    reading and the user's name. ``what`` names the job in the messages."""
    started = clock()
    backoff = PollBackoff(initial=wait.initial, maximum=max(wait.initial, wait.maximum))
    refused = first
    said, said_at, read_for = "", float("-inf"), ""
    while True:
        refusal = _refusal_of(refused)
        now = clock()
        # the limit is read (one round trip) at the first refusal, when another limit
        # refuses the job, and every log_interval seconds
        if now - said_at >= wait.log_interval or refusal.code != read_for:
            read_for = refusal.code
            reading, user = read_limit(refusal)
            if never_fits(reading):
                raise SchedulerError(
                    f"{what} can never be submitted: the {refusal.field} limit of "
                    f"{reading.holder if reading else '?'} is 0 (sbatch: {refusal.code}); "
                    "ask the site to raise it or submit under another account or QOS")
            line = f"{what}: {describe_wait(refusal, reading, user)}"
            if line != said or now - said_at >= wait.log_interval:
                wait.emit(line)
                said, said_at = line, now
        waited = now - started
        if wait.timeout is not None and waited >= wait.timeout:
            raise SubmitLimitTimeout(
                f"{what} was not submitted: Slurm refused it for {waited:.0f} s under the "
                f"submission limit {refusal.field} (sbatch: {refusal.code}; last: "
                f"{said or 'nothing read'}) and {TIMEOUT_FIELD}={wait.timeout:g} s of "
                "SlurmResource ran out. Let other jobs of the user end first, raise "
                f"{TIMEOUT_FIELD}, or set it to None to wait for ever")
        delay = backoff.observe(False)
        if wait.timeout is not None:
            delay = min(delay, max(0.0, wait.timeout - waited))
        sleep_checking(sleep, delay, wait.check, wait.check_interval)
        if wait.check is not None:
            wait.check()
        try:
            job = submit()
        except SubmitLimitReached as again:
            refused = again
            continue
        wait.emit(f"{what}: a slot freed after {clock() - started:.0f} s; submitted")
        return job


def _refusal_of(error: SubmitLimitReached) -> SubmitRefusal:
    refusal = error.refusal
    if not isinstance(refusal, SubmitRefusal):
        raise TypeError(f"SubmitLimitReached without a SubmitRefusal: {refusal!r}")
    return refusal


def refusal_error(job_name: str, message: str) -> SchedulerError:
    """The error of an sbatch that refused ``job_name`` with ``message``:
    :class:`SubmitLimitReached` for a limit on queued jobs, a :class:`SchedulerError` with
    what to change for a limit the job can never meet, else a plain one."""
    refusal = classify_refusal(message)
    if refusal is not None and refusal.kind is RefusalKind.WAIT:
        return SubmitLimitReached(
            f"sbatch refused job {job_name!r} for the submission limit {refusal.field} "
            f"({refusal.code}): {message}", refusal)
    if refusal is not None:
        return SchedulerError(
            f"sbatch rejected job {job_name!r}: {message}; it can never be queued as "
            f"submitted ({refusal.code}): {refusal.advice}")
    return SchedulerError(f"sbatch rejected job {job_name!r}: {message}")


class _Counter(Protocol):
    def count(self, command: str, n: int = 1) -> None: ...


def read_limit(agent: AgentClient, stats: _Counter, refusal: SubmitRefusal, *,
               account: str | None, qos: str | None) -> tuple[LimitReading | None, str]:
    """The submission limit behind ``refusal`` and the user's queued jobs it counts, in
    one round trip (``id``, two ``sacctmgr`` and one ``squeue``), with the login user's
    name. A query that fails gives a reading whose ``problem`` names it. ``account`` and
    ``qos``: what the job asked for (None: the user's defaults)."""
    argvs = submit_limit_argvs()
    with agent.batch() as batch:
        pending = {name: batch.add(exec_op(argv, timeout=30.0)) for name, argv in argvs.items()}
    stats.count("sacctmgr", 2)
    stats.count("squeue")
    outputs: dict[str, str] = {}
    failed: list[str] = []
    for name, item in pending.items():
        try:
            answer = item.result()
        except AgentOpError as exc:
            failed.append(f"{argvs[name][0]}: {exc}")
            continue
        if answer.rc != 0:
            failed.append(f"{shlex.join(argvs[name][:2])}: "
                          f"{(answer.stderr or answer.stdout).strip() or answer.rc}")
            continue
        outputs[name] = answer.stdout
    user = outputs.get("user", "").strip() or "(unknown user)"
    if failed:
        return LimitReading(None, None, None, "; ".join(failed)), user
    return parse_limits(refusal, user=user, associations=outputs["associations"],
                        qos=outputs["qos"], queue=outputs["queue"],
                        account=account, job_qos=qos), user
