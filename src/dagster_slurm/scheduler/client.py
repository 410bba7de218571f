"""Scheduler operations through the cluster-side agent.

Each method of :class:`SlurmScheduler` is one agent request, that is one SSH round trip,
and at most one scheduler RPC except where stated (a status poll adds one batched ``sacct``
only for known jobs that have left ``squeue``). The counts are kept in
:class:`SchedulerStats` for benchmarks and tests.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shlex
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dagster_slurm.agent import (
    AgentClient,
    AgentOp,
    AgentOpError,
    PendingResult,
    SharedSqueue,
    exec_op,
    job_status_op,
    submit_op,
    write_file_op,
)
from dagster_slurm.agent.results import ExecResult, JobStatusResult
from dagster_slurm.errors import CommandFailed, SubmitLimitReached
from dagster_slurm.scheduler.accounting_outlook import AccountingOutlook, probe_argv, reach_of
from dagster_slurm.scheduler.observations import (
    JobObservation,
    SchedulerStats,
    StatusSnapshot,
    SubmittedJob,
    parse_exit_code,
)
from dagster_slurm.scheduler.pacing import RateLimiter
from dagster_slurm.scheduler.submit_wait import (
    LimitWait,
    read_limit,
    refusal_error,
    wait_for_slot,
)
from dagster_slurm.slurm import (
    SacctRecord,
    SbatchSpec,
    TestOnlyResult,
    min_job_age_seconds,
    parse_sacct,
    parse_scontrol_config,
    parse_squeue,
    parse_test_only,
    sacct_argv,
    sacct_base_argv,
    sbatch_argv,
    scancel_argv,
    scontrol_show_config_argv,
    squeue_argv,
    squeue_state_argv,
    squeue_user_argv,
)
from dagster_slurm.slurm.het_records import fold_accounting_records, fold_queue_records
from dagster_slurm.slurm.submit_limits import RELEASE_ON
from dagster_slurm.slurm.test_only import TEST_ONLY_ENV, TEST_ONLY_SCRIPT, unanswered
from dagster_slurm.slurm.version import SlurmFeature, SlurmVersion, offers
from dagster_slurm.transport.base import CommandResult

__all__ = [
    "JobObservation", "SchedulerStats", "SlurmScheduler", "StatusSnapshot", "SubmittedJob",
    "new_token", "parse_exit_code",
]

log = logging.getLogger("dagster_slurm.scheduler")


#: This process's id in the user's shared squeue answer: a refresh by this process (any of
#: its schedulers, one after another) never makes it wait for the floor another sets.
_PROCESS_ID = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def new_token() -> str:
    """A fresh submission token (carried as the job's comment)."""
    return f"dslurm-{secrets.token_hex(8)}"


class SlurmScheduler:
    """Submit, poll, cancel and probe jobs; one agent request per call (see module doc)."""

    def __init__(
        self,
        agent: AgentClient,
        *,
        submit_interval: float = 0.2,
        status_max_age: float = 2.0,
        status_path: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.agent = agent
        #: Seconds the user's shared squeue answer may be old to serve a shared poll.
        self.status_max_age = status_max_age
        #: The shared answer's file on the login node (``{uid}`` is filled in there with the
        #: login user's id); None: no sharing, every poll runs its own squeue.
        self.status_path = status_path
        self._client_id = _PROCESS_ID
        self.stats = SchedulerStats()
        self._submit_limit = RateLimiter(submit_interval, clock=clock, sleep=sleep)
        self._clock, self._sleep = clock, sleep
        self._config: dict[str, str] | None = None
        self._clock = clock
        #: What this process knows of the cluster's accounting: fed by every sacct answer
        #: and by the probe a status poll carries when nothing was heard for a minute.
        self.accounting_outlook = AccountingOutlook()

    def now(self) -> float:
        """The scheduler's clock (monotonic seconds), the time base of
        :attr:`accounting_outlook`."""
        return self._clock()

    @property
    def version(self) -> SlurmVersion | None:
        """The cluster's Slurm release as the agent learnt it in this connection's first
        round trip (see :class:`~dagster_slurm.agent.client.AgentClient`); None before that,
        or when unknown. Commands are built for it; None builds those of Slurm 22.05."""
        return self.agent.slurm_version if self.agent is not None else None

    # -- submission ------------------------------------------------------------------------
    def submit(
        self,
        spec: SbatchSpec,
        *,
        state_path: str,
        record: str = "/job",
        files: Mapping[str, tuple[str | bytes, int]] | None = None,
        token: str | None = None,
        lock_path: str | None = None,
        record_value: Mapping[str, Any] | None = None,
        create: Mapping[str, Any] | None = None,
        guards: Sequence[Mapping[str, Any]] = (),
        on_submitted: tuple[str, Mapping[str, Any]] | None = None,
        limit_wait: LimitWait | None = None,
    ) -> SubmittedJob:
        """Write ``files`` (path -> (content, mode)), then submit ``spec`` with a token.

        The token is recorded in the JSON document ``state_path`` (at pointer ``record``)
        *before* sbatch runs and is passed as the job's ``--comment``, so a submission
        whose answer was lost can be found again. Raises :class:`SchedulerError` with
        Slurm's message when sbatch rejects the job. ``lock_path`` defaults to
        ``<state_path>.lock``; ``record_value`` adds fields to the submission record;
        ``create`` is the document written when ``state_path`` does not exist yet;
        ``guards`` must hold when the token is recorded (else
        :class:`~dagster_slurm.agent.exceptions.SubmitGuardFailed`, nothing submitted). When
        ``record`` already holds another submission, the agent's
        :class:`~dagster_slurm.agent.exceptions.SubmissionInDoubt` propagates (the record is
        still ``submitting``) or the other job is returned with ``recovered`` set.
        ``on_submitted`` (``(path template, value)``, e.g. ``("/workers/{job_id}", {...})``)
        also writes the job's own record when sbatch answered (see the agent's ``submit``).

        A refusal for a limit on queued jobs (``MaxSubmitJobs``, ...) raises
        :class:`~dagster_slurm.errors.SubmitLimitReached`, or with ``limit_wait`` waits for
        a free slot and submits again under the same token
        (:func:`~dagster_slurm.scheduler.submit_wait.wait_for_slot`). A refusal for a limit
        the job can never meet raises :class:`SchedulerError` with what to change.
        """
        token = token or new_token()
        spec = _with_comment(spec, token)
        once = dict(state_path=state_path, lock_path=lock_path or state_path + ".lock",
                    record=record, record_value=record_value,
                    create=dict(create) if create is not None else {"schema_version": 1},
                    guards=guards, on_submitted=on_submitted)
        try:
            return self._submit_once(spec, token, files=files, **once)
        except SubmitLimitReached as refused:
            if limit_wait is None:
                raise
            return wait_for_slot(
                refused, limit_wait,
                submit=lambda: self._submit_once(spec, token, files=None, **once),
                read_limit=lambda refusal: read_limit(self.agent, self.stats, refusal,
                                                      account=spec.account, qos=spec.qos),
                what=f"Slurm job {spec.job_name!r}", clock=self._clock, sleep=self._sleep)

    def _submit_once(self, spec: SbatchSpec, token: str, *, state_path: str, lock_path: str,
                     record: str, record_value: Mapping[str, Any] | None,
                     create: Mapping[str, Any], guards: Sequence[Mapping[str, Any]],
                     on_submitted: tuple[str, Mapping[str, Any]] | None,
                     files: Mapping[str, tuple[str | bytes, int]] | None) -> SubmittedJob:
        """One sbatch of ``spec`` (see :meth:`submit`). A refusal for a limit on queued jobs
        leaves no record (the agent's ``release_on``), so the same token can be submitted
        again; ``files`` None on a retry (they were written by the first attempt)."""
        self._submit_limit.acquire()
        with self.agent.batch() as batch:
            written = [
                batch.add(write_file_op(path, content, mode=mode, makedirs=True))
                for path, (content, mode) in (files or {}).items()
            ]
            submitted = batch.add(submit_op(
                sbatch_argv(spec, version=self.version), token=token, state_path=state_path,
                lock_path=lock_path, record=record, record_value=record_value, create=create,
                guards=guards, on_submitted=on_submitted, release_on=RELEASE_ON), requires=written)
        for item in written:
            item.result()
        self.stats.count("sbatch")
        result = submitted.result()
        if not result.ok:
            message = (result.stderr or result.stdout).strip() or f"status {result.status}"
            raise refusal_error(spec.job_name, message)
        assert result.job_id is not None
        return SubmittedJob(result.job_id, token, result.recovered)

    # -- status ----------------------------------------------------------------------------
    def status(
        self,
        job_names: Sequence[str],
        known_ids: Sequence[str] = (),
        *,
        status_files: Mapping[str, str] | None = None,
        accounting: bool = True,
        heartbeats: Mapping[str, str] | None = None,
        shared: bool = False,
        fresh: bool = False,
        state_only: bool = False,
    ) -> StatusSnapshot:
        """One squeue for every job of ``job_names``; sacct only for known ids it lacks.

        ``heartbeats`` (path -> content) are written in the same round trip (0600, atomic,
        never creating a directory: a job directory already removed stays removed); a
        write that fails is logged and does not affect the answer. ``shared``, ``fresh``
        and ``state_only``: see :meth:`status_op`.
        """
        op = self.status_op(job_names, known_ids, status_files=status_files,
                            accounting=accounting, shared=shared, fresh=fresh,
                            state_only=state_only)
        probing = accounting and self.accounting_outlook.probe_due(self._clock())
        with self.agent.batch() as batch:
            status = batch.add(op)
            beats = [(path, batch.add(write_file_op(path, content)))
                     for path, content in (heartbeats or {}).items()]
            probe = batch.add(exec_op(probe_argv(), timeout=30.0)) if probing else None
        if probe is not None:
            self._observe_accounting(probe)
        for path, beat in beats:
            if not beat.ok:
                log.debug("heartbeat %s not written: %s", path, (beat.raw or {}).get("error"))
        now = batch.response.now if batch.response else None
        return self.snapshot(status.result(), now)

    def status_op(
        self,
        job_names: Sequence[str],
        known_ids: Sequence[str] = (),
        *,
        status_files: Mapping[str, str] | None = None,
        accounting: bool = True,
        shared: bool = False,
        fresh: bool = False,
        state_only: bool = False,
    ) -> AgentOp[JobStatusResult]:
        """The status poll as an agent op, to send in a batch with other operations; turn its
        result into a :class:`StatusSnapshot` with :meth:`snapshot`.

        With ``shared`` (and ``known_ids``), the answer about ``known_ids`` comes from the
        user's shared squeue answer on the login node (one ``squeue --me`` for every process
        of the user), when it is at most :attr:`status_max_age` seconds old and lists every
        known id; with ``fresh`` only an answer taken after the poll started serves it (still
        one squeue for all polls that need one at that moment). The snapshot then holds only
        the known ids' jobs, not every job of ``job_names``.

        ``state_only`` (with ``known_ids``): the caller needs only the jobs' states (a job
        that already runs and is followed until it ends). On a release with
        ``squeue --only-job-state`` (:attr:`version`, see
        :func:`~dagster_slurm.slurm.commands.squeue_state_argv`) that lighter query of the
        known ids answers, unshared, and the snapshot's queue records hold job id and
        state only; elsewhere the poll is the one above."""
        version = self.version
        sacct = sacct_base_argv(version=version) if accounting else None
        if state_only and known_ids and offers(version, SlurmFeature.ONLY_JOB_STATE):
            return job_status_op(squeue_state_argv(job_names, known_ids, version=version),
                                 list(known_ids), sacct_argv=sacct, status_files=status_files)
        share = None
        if shared and known_ids and self.status_path:
            share = SharedSqueue(self.status_path, tuple(squeue_user_argv(version=version)),
                                 0.0 if fresh else self.status_max_age,
                                 floor=self.status_max_age, client=self._client_id)
        return job_status_op(
            squeue_argv(job_names, version=version),
            list(known_ids),
            sacct_argv=sacct,
            status_files=status_files,
            shared=share,
        )

    def user_status_op(self) -> AgentOp[JobStatusResult] | None:
        """Every job of the login user, served from the user's shared squeue answer (at most
        :attr:`status_max_age` old) as an agent op; None without a shared answer's path.
        Read it with :meth:`snapshot` (``absent`` is empty: nothing is known to be missing)."""
        if not self.status_path:
            return None
        argv = tuple(squeue_user_argv(version=self.version))
        return job_status_op(list(argv), [], shared=SharedSqueue(
            self.status_path, argv, self.status_max_age, all_jobs=True,
            floor=self.status_max_age, client=self._client_id))

    def snapshot(self, result: JobStatusResult, now: float | None) -> StatusSnapshot:
        """The :class:`StatusSnapshot` of a :meth:`status_op` result (counts the calls: a
        shared answer this poll did not produce costs no squeue; it counts as
        ``squeue_shared``). ``observed_at`` is when the answer's squeue started, for a shared
        answer, else ``now``."""
        response_now = now
        if result.squeue.shared_at is not None:
            response_now = result.squeue.shared_at
        self.stats.count("squeue" if result.squeue.ran else "squeue_shared")
        acct: dict[str, SacctRecord] = {}
        if result.sacct is not None:
            self.stats.count("sacct")
            self.accounting_outlook.observe(reach_of(result.sacct.rc, result.sacct.stderr),
                                            self._clock())
            if result.sacct.rc == 0:
                acct = parse_sacct(result.sacct.stdout)
        records = {r.job_id: r for r in parse_squeue(result.squeue.stdout)} if result.squeue.rc == 0 else {}
        # A heterogeneous job is followed by its own id, listed as one line per component.
        records, acct = fold_queue_records(records), fold_accounting_records(acct)
        codes = {
            job_id: parse_exit_code(sf.data) for job_id, sf in result.status_files.items() if sf.exists
        }
        return StatusSnapshot(
            observed_at=response_now,
            certain=result.squeue.rc == 0 and result.absent_ids is not None,
            queue=records,
            accounting=acct,
            exit_codes=codes,
            absent=result.absent_ids or (),
            error=None if result.squeue.rc == 0 else (result.squeue.stderr or result.squeue.error),
        )

    def accounting(self, job_ids: Sequence[str]) -> dict[str, SacctRecord]:
        """Final accounting of finished jobs (empty when accounting is unavailable)."""
        op = self.accounting_op(job_ids)
        return self.accounting_records(self.agent.run(op))

    def accounting_op(self, job_ids: Sequence[str]) -> AgentOp[ExecResult]:
        """The sacct call of :meth:`accounting` as an agent op, to send in a batch with other
        operations; read its result with :meth:`accounting_records`."""
        return exec_op(sacct_argv(job_ids, version=self.version), timeout=60.0)

    def accounting_records(self, result: ExecResult) -> dict[str, SacctRecord]:
        """Records of an :meth:`accounting_op` result (counts the call; empty when sacct
        failed, for example without accounting)."""
        self.stats.count("sacct")
        self.accounting_outlook.observe(reach_of(result.rc, result.stderr), self._clock())
        return fold_accounting_records(parse_sacct(result.stdout)) if result.rc == 0 else {}

    def _observe_accounting(self, probe: PendingResult[ExecResult]) -> None:
        """Feed a probe's answer to :attr:`accounting_outlook` (an op that got no answer
        tells nothing). Counted as ``sacct_probe``: it asks slurmdbd for no job."""
        self.stats.count("sacct_probe")
        try:
            result = probe.result()
        except Exception as exc:  # noqa: BLE001 - the probe only informs
            log.debug("accounting probe gave no answer: %s", exc)
            return
        self.accounting_outlook.observe(reach_of(result.rc, result.stderr), self._clock())

    # -- control ---------------------------------------------------------------------------
    def cancel(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        job_name: str | None = None,
        signal: str | None = None,
        batch_only: bool = False,
    ) -> None:
        """scancel the given jobs or every job of ``job_name`` (optionally only a signal)."""
        argv = scancel_argv(job_ids=job_ids, job_name=job_name, signal=signal,
                            batch_only=batch_only, version=self.version)
        result = self._exec(argv, "scancel", check=False)
        if not result.ok and "Invalid job id" not in result.stderr:
            raise CommandFailed(result, "scancel")

    def test_only(self, spec: SbatchSpec) -> TestOnlyResult:
        """Ask ``sbatch --test-only`` when and where ``spec`` would start (nothing is queued)."""
        argv = sbatch_argv(spec, test_only=True, script_on_stdin=True, version=self.version)
        result = self._exec(argv, "sbatch", check=False, stdin="#!/bin/sh\ntrue\n")
        return parse_test_only(result.stderr + result.stdout, result.exit_code)

    def test_only_op(self, spec: SbatchSpec, *, timeout: float = 30.0) -> AgentOp[ExecResult]:
        """``sbatch --test-only`` for ``spec`` as an agent op, to send several in one batch:
        the script on standard input (:data:`~dagster_slurm.slurm.test_only.TEST_ONLY_SCRIPT`),
        the start time printed in UTC (:data:`~dagster_slurm.slurm.test_only.TEST_ONLY_ENV`).
        Read its result with :meth:`test_only_answer`."""
        argv = sbatch_argv(spec, test_only=True, script_on_stdin=True, version=self.version)
        return exec_op(argv, stdin=TEST_ONLY_SCRIPT, env=TEST_ONLY_ENV, timeout=timeout)

    def test_only_answer(self, pending: PendingResult[ExecResult]) -> TestOnlyResult:
        """The answer of a :meth:`test_only_op` that ran in a batch (counts one
        ``sbatch_test`` call); its ``start_time`` is UTC (see
        :func:`~dagster_slurm.slurm.test_only.start_epoch`). A call that timed out or could
        not run gives no verdict: ``runnable`` None and the agent's message as ``error``."""
        self.stats.count("sbatch_test")
        try:
            result = pending.result()
        except AgentOpError as exc:
            return unanswered(f"sbatch --test-only gave no answer: {exc}")
        return parse_test_only(result.stderr + result.stdout, result.rc)

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict, fetched once per scheduler."""
        if self._config is None:
            result = self._exec(scontrol_show_config_argv(version=self.version), "scontrol",
                                check=True)
            self._config = parse_scontrol_config(result.stdout)
        return self._config

    def min_job_age(self) -> int | None:
        """Seconds a finished job stays listed by squeue (``MinJobAge``), None if unknown."""
        return min_job_age_seconds(self.config())

    def _exec(
        self, argv: list[str], what: str, *, check: bool, stdin: str | None = None
    ) -> CommandResult:
        op = exec_op(argv, timeout=60.0, stdin=stdin)
        result = self.agent.run(op)
        self.stats.count(what)
        code = result.rc if result.rc is not None else -1
        outcome = CommandResult(shlex.join(argv), code, result.stdout, result.stderr, 0.0)
        if check and not outcome.ok:
            raise CommandFailed(outcome, what)
        return outcome


def _with_comment(spec: SbatchSpec, token: str) -> SbatchSpec:
    return dataclasses.replace(spec, comment=token)
