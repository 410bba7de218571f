"""A worker allocation hosts the run's Ray head: the ``WORKER`` path of a head election.

The elector asks the chosen worker allocation (``HeadChoice.job_id``) to host a head-only
control plane by writing ``jobs/<job id>/host_head`` (``term=<term>``). Its batch script
(``templates/ray_worker.sh``) looks at that file every second, and five times a second
while the head it follows is not live: it starts ``ray start --head``
with no CPUs and no GPUs on its first node, next to that node's Ray worker, then the
session's step server (rendered into the worker's submission directory when it was
submitted) with ``RAY_ADDRESS`` pointing at the new head. The step server writes the
session's ``ray_head`` (which every worker allocation follows, this one included) and the
job's ``ready`` file. A head that does not start is reported in
``jobs/<job id>/host_head_state`` (``failed term=<term> <reason>``).

The elector waits (its claim is renewed meanwhile) for ``started term=<term>`` in
``host_head_state`` and ``ready`` with a Ray address (read every
:data:`HOST_POLL_INTERVAL` seconds, squeue at a backoff's pace), then
installs the worker allocation as the session's head record
(:func:`~dagster_slurm.state.election_transitions.install_elected_head`, which releases the
claim in the same change). A reported failure, the job's end or :data:`HOST_TIMEOUT`
seconds without ``ready`` raise :class:`WorkerHostFailed` after ``stop term=<term>`` was
written to ``host_head`` (the script then stops what it started for that term); the caller
fails the claim (a failure counted for the candidate) and elects again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dagster_slurm.backoff import PollBackoff, StatusPace
from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.jobs.logs import ProgressLog
from dagster_slurm.session.core.allocation import parse_ready
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.state import election_transitions as et
from dagster_slurm.state import transitions as tr
from dagster_slurm.state.election import HeadChoice

if TYPE_CHECKING:
    from dagster_slurm.session.core.allocation import SlurmAllocation
    from dagster_slurm.session.core.context import SessionContext

#: Seconds the elector waits for a worker allocation's control plane to accept steps.
HOST_TIMEOUT = 120.0

#: Seconds between the elector's reads of ``ready`` and ``host_head_state`` (one round trip
#: to the login node, no scheduler call): the head is seen this soon after it reports
#: itself. squeue, which only tells whether the job ended, is asked at a backoff's pace
#: (0.5 s growing to 3 s).
HOST_POLL_INTERVAL = 0.2


class WorkerHostFailed(SessionError):
    """The chosen worker allocation did not bring up a head (reported failure, its job
    ended, or :data:`HOST_TIMEOUT` passed); the election fails and is held again."""


def host_head_path(session: SessionContext, job_id: str) -> str:
    """The request file of worker allocation ``job_id`` (``term=<n>`` or ``stop term=<n>``)."""
    return f"{session.paths.job_dir(job_id)}/host_head"


def host_state_path(session: SessionContext, job_id: str) -> str:
    """What worker allocation ``job_id`` reports of its head (``starting|started|failed
    term=<n> ...``)."""
    return f"{session.paths.job_dir(job_id)}/host_head_state"


def _failure(text: str | None, term: int) -> str | None:
    """The reason in ``host_head_state`` when it reports a failure of ``term`` (else None)."""
    for line in (text or "").splitlines():
        words = line.split(None, 2)
        if len(words) >= 2 and words[0] == "failed" and words[1] == f"term={term}":
            return words[2] if len(words) > 2 else "the head did not start"
    return None


def _started(text: str | None, term: int) -> bool:
    """True when ``host_head_state`` says the head of ``term`` started (a ready file left
    by an earlier term does not count)."""
    return any(line.split()[:2] == ["started", f"term={term}"]
               for line in (text or "").splitlines())


def host_on_worker(session: SessionContext, choice: HeadChoice, owner: str,
                   deadline: float | None, out: ProgressLog,
                   timeout: float = HOST_TIMEOUT) -> SlurmAllocation:
    """Make worker allocation ``choice.job_id`` the head under ``owner``'s claim of
    ``choice.term`` (see the module docstring); the head's allocation object, cached as
    the session's. ``deadline`` (session clock; None: none) bounds the wait with
    ``timeout``."""
    job_id, term = choice.job_id, choice.term
    assert job_id is not None
    request = host_head_path(session, job_id)
    session.io.write_files({request: (f"term={term}\n", 0o600)})
    out.info(f"Worker allocation {job_id} was asked to host the head of {session.job_name} "
             f"on its first node {choice.node or '?'} (term {term})")
    limit = session.clock() + timeout
    if deadline is not None:
        limit = min(limit, deadline)
    pace = StatusPace(PollBackoff(initial=0.5, maximum=3.0, factor=1.5))
    ready_path, state_path = session.paths.ready(job_id), host_state_path(session, job_id)
    try:
        while True:
            with_status = pace.due(session.clock())
            polled = session.io.poll_files(session.job_name, job_id, [ready_path, state_path],
                                           with_status=with_status)
            reason = _failure(polled.texts.get(state_path), term)
            if reason is not None:
                raise WorkerHostFailed(f"worker allocation {job_id} could not host the head: "
                                       f"{reason}")
            snapshot = polled.status
            ended = snapshot.ended_state(job_id) if snapshot is not None else None
            if ended is not None:
                raise WorkerHostFailed(f"worker allocation {job_id} ended ({ended}) before "
                                       "its head started")
            text = polled.texts.get(ready_path)
            if _started(polled.texts.get(state_path), term) and text and text.endswith("\n"):
                values = parse_ready(text)
                if values.get("ray_address"):
                    return _install(session, job_id, term, owner, values, out)
            if session.clock() >= limit:
                raise WorkerHostFailed(
                    f"worker allocation {job_id} did not start a head within "
                    f"{timeout:.0f} s (its log: {session.paths.output.replace('%j', job_id)})")
            if with_status:
                pace.asked(session.clock())
            session.pause(HOST_POLL_INTERVAL,
                           f"the head control plane of worker allocation {job_id}")
    except BaseException:
        try:
            session.io.write_files({request: (f"stop term={term}\n", 0o600)})
        except DagsterSlurmError as exc:
            out.warning(f"could not ask worker allocation {job_id} to stop its head: {exc}")
        raise


def _install(session: SessionContext, job_id: str, term: int, owner: str,
             values: dict[str, Any], out: ProgressLog) -> SlurmAllocation:
    nodes = tuple(session.io.read_lines(session.paths.nodes(job_id)))
    read = session.io.read()
    decided = et.install_elected_head(read.doc, owner=owner, term=term, job_id=job_id,
                                      nodes=list(nodes), ray_address=values["ray_address"],
                                      now=read.now)
    if isinstance(decided, tr.Refused):
        raise WorkerHostFailed(f"worker allocation {job_id} was not installed as the head: "
                               f"{decided.reason}")
    if not session.io.apply(decided).ok:
        raise WorkerHostFailed(f"worker allocation {job_id} was not installed as the head: "
                               "the session document changed meanwhile")
    record = read.doc.workers.get(job_id) if read.doc is not None else None
    config = dict(record.config) if record is not None else None
    allocation = session.make_allocation(job_id, nodes, values, config)
    session.current.install(allocation)
    out.info(f"Worker allocation {job_id} hosts the head of {session.job_name} "
             f"(nodes {','.join(nodes) or '?'}, Ray at {allocation.ray_address})")
    return allocation
