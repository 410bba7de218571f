"""Submissions the scheduler refuses for a per-user, per-account or QOS limit.

A site caps what a user may have queued (``MaxSubmitJobs`` of an association,
``MaxSubmitJobsPerUser`` of a QOS, ...). ``sbatch`` beyond such a cap exits 1 and prints,
in Slurm 22.05 (texts seen on the development cluster)::

    sbatch: error: AssocMaxSubmitJobLimit
    sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)

The first line names the limit. A limit on a *count* of queued jobs frees itself when a job
of the user (or account) ends: :func:`classify_refusal` calls it :attr:`RefusalKind.WAIT`.
A limit on the job's own size or walltime (``QOSMaxWallDurationPerJobLimit``, and with the
QOS flag ``DenyOnLimit`` the TRES limits) can never be met by waiting:
:attr:`RefusalKind.HOPELESS`, with what to change. Any other failure is not a limit refusal
(None).

:func:`parse_limits` reads the one extra round trip that says what the limit is (``sacctmgr``
associations and QOS, ``squeue`` of the user) and :func:`describe_wait` puts it in words.
Everything here is pure.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: The sentence every accounting-policy refusal of ``sbatch`` ends with (22.05 to 24.11).
POLICY_SENTENCE = "Job violates accounting/QOS policy"


class LimitScope(str, enum.Enum):
    """Whose queued jobs a count limit counts."""

    #: The user's own jobs in one association (``MaxSubmitJobs`` of the user).
    ASSOCIATION_USER = "association"
    #: All jobs of the association's account (``GrpSubmitJobs``).
    ASSOCIATION_GROUP = "account"
    #: The user's jobs in the QOS (``MaxSubmitJobsPerUser``).
    QOS_USER = "qos"
    #: The jobs of the user's account in the QOS (``MaxSubmitJobsPerAccount``).
    QOS_ACCOUNT = "qos_account"
    #: All jobs in the QOS (``GrpSubmitJobs`` of the QOS).
    QOS_GROUP = "qos_group"


class RefusalKind(str, enum.Enum):
    """What to do about a refused submission."""

    #: A limit on the number of queued jobs: submit again once one has ended.
    WAIT = "wait"
    #: A limit the job can never meet as submitted: fail now and say what to change.
    HOPELESS = "hopeless"


#: Count limits (reason code printed by sbatch -> whose jobs count). The codes of Slurm
#: 22.05; later versions print the same names.
COUNT_LIMITS: Mapping[str, LimitScope] = {
    "AssocMaxSubmitJobLimit": LimitScope.ASSOCIATION_USER,
    "AssocGrpSubmitJobsLimit": LimitScope.ASSOCIATION_GROUP,
    "QOSMaxSubmitJobPerUserLimit": LimitScope.QOS_USER,
    "QOSMaxSubmitJobPerAccountLimit": LimitScope.QOS_ACCOUNT,
    # 22.05 prints this bare name for a QOS's MaxSubmitJobsPerAccount.
    "MaxSubmitJobsPerAccount": LimitScope.QOS_ACCOUNT,
    "QOSGrpSubmitJobsLimit": LimitScope.QOS_GROUP,
}

#: What the agent's ``submit`` looks for in a refusal to drop the submission's record instead
#: of marking it failed: the count limits, which the caller waits out.
RELEASE_ON: tuple[str, ...] = tuple(COUNT_LIMITS)

#: The limit field of each scope, as ``sacctmgr`` names it (for the log and errors).
LIMIT_FIELDS: Mapping[LimitScope, str] = {
    LimitScope.ASSOCIATION_USER: "MaxSubmitJobs",
    LimitScope.ASSOCIATION_GROUP: "GrpSubmitJobs",
    LimitScope.QOS_USER: "MaxSubmitJobsPerUser",
    LimitScope.QOS_ACCOUNT: "MaxSubmitJobsPerAccount",
    LimitScope.QOS_GROUP: "GrpSubmitJobs",
}

_SIZE_ADVICE = (
    (re.compile(r"WallDuration|Wall"), "the walltime is above the limit: lower time_limit "
     "or use another qos/account"),
    (re.compile(r"Node"), "the node count is above the limit: lower num_nodes"),
    (re.compile(r"Cpu|CPU"), "the CPU request is above the limit: lower cpus_per_task or "
     "the node count"),
    (re.compile(r"Mem"), "the memory request is above the limit: lower mem"),
    (re.compile(r"GRES|Gres|Tres|TRES|Billing"), "the GPU/TRES request is above the limit: "
     "lower it or use another qos"),
)

#: A line ending in ``sbatch: error: <Code>`` (callers may have put words before it).
_CODE_LINE = re.compile(r"sbatch:\s*error:\s*([A-Z][A-Za-z]+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class SubmitRefusal:
    """A refusal of ``sbatch`` for a limit: the limit's ``code`` as printed, ``kind``,
    ``scope`` (count limits only) and ``advice`` (hopeless limits only)."""

    code: str
    kind: RefusalKind
    scope: LimitScope | None = None
    advice: str | None = None

    @property
    def field(self) -> str:
        """The sacctmgr field behind a count limit (the code itself otherwise)."""
        return LIMIT_FIELDS[self.scope] if self.scope is not None else self.code


def classify_refusal(text: str) -> SubmitRefusal | None:
    """The limit that made ``sbatch`` refuse a job, from its output (stderr and stdout);
    None when ``text`` is not an accounting-policy refusal.

    A policy refusal whose limit code is missing or unknown counts as hopeless: waiting
    would not be known to help.
    """
    if POLICY_SENTENCE not in text:
        return None
    found = _CODE_LINE.search(text)
    code = found.group(1) if found else ""
    scope = COUNT_LIMITS.get(code)
    if scope is not None:
        return SubmitRefusal(code, RefusalKind.WAIT, scope)
    advice = next((words for pattern, words in _SIZE_ADVICE if pattern.search(code)), None)
    return SubmitRefusal(
        code or "accounting policy", RefusalKind.HOPELESS, None,
        advice or "the job exceeds a limit of your association or QOS; ask the site which "
        "(sacctmgr show associations / show qos) and change the request",
    )


# -- the numbers -----------------------------------------------------------------------------------

#: ``sacctmgr`` columns read by :func:`parse_limits` (``format=`` of the association query).
ASSOC_FORMAT = ("Account", "User", "MaxSubmit", "GrpSubmit", "QOS", "DefaultQOS")
#: ``sacctmgr`` columns of the QOS query.
QOS_FORMAT = ("Name", "MaxSubmitPU", "MaxSubmitPA", "GrpSubmit")
#: ``squeue`` format of the user's queued jobs: user, account, QOS.
QUEUE_FORMAT = "%u|%a|%q"


@dataclass(frozen=True)
class QueuedJobs:
    """The user's queued (pending or running) jobs: ``total``, and counts by account and
    by QOS."""

    total: int
    by_account: Mapping[str, int]
    by_qos: Mapping[str, int]


@dataclass(frozen=True)
class LimitReading:
    """What one extra round trip said about a count limit: ``limit`` (None when it could
    not be read), ``holder`` (the account or QOS it belongs to), ``queued`` (the user's
    queued jobs it counts, None when unknown) and ``problem`` (why a number is missing)."""

    limit: int | None
    holder: str | None
    queued: int | None
    problem: str | None = None


def _rows(text: str, columns: Sequence[str]) -> list[dict[str, str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        rows.append(dict(zip(columns, [v.strip() for v in values], strict=False)))
    return rows


def _number(text: str | None) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


def parse_queued(text: str, user: str) -> QueuedJobs:
    """Count ``user``'s jobs in ``squeue -h -o '%u|%a|%q'`` output."""
    by_account: dict[str, int] = {}
    by_qos: dict[str, int] = {}
    total = 0
    for row in _rows(text, ("user", "account", "qos")):
        if row.get("user") != user:
            continue
        total += 1
        by_account[row.get("account", "")] = by_account.get(row.get("account", ""), 0) + 1
        by_qos[row.get("qos", "")] = by_qos.get(row.get("qos", ""), 0) + 1
    return QueuedJobs(total, by_account, by_qos)


def parse_limits(refusal: SubmitRefusal, *, user: str, associations: str, qos: str,
                 queue: str, account: str | None = None,
                 job_qos: str | None = None) -> LimitReading:
    """The count limit behind ``refusal`` and how many of ``user``'s jobs it counts.

    ``associations``: ``sacctmgr -nP show associations format=`` :data:`ASSOC_FORMAT`;
    ``qos``: ``sacctmgr -nP show qos format=`` :data:`QOS_FORMAT`; ``queue``: ``squeue -h
    -o`` :data:`QUEUE_FORMAT`. ``account`` and ``job_qos``: what the job asked for (None:
    the user's default, or the smallest limit found). A number that is not found leaves it
    None and says why in ``problem``.
    """
    scope = refusal.scope
    queued = parse_queued(queue, user)
    if scope is None:
        return LimitReading(None, None, None, f"{refusal.code} is not a limit on a count of jobs")
    assocs = _rows(associations, ASSOC_FORMAT)
    mine = [a for a in assocs if a.get("User") == user
            and (account is None or a.get("Account") == account)]
    if scope in (LimitScope.ASSOCIATION_USER, LimitScope.ASSOCIATION_GROUP):
        if scope is LimitScope.ASSOCIATION_USER:
            candidates = [(_number(a.get("MaxSubmit")), a.get("Account", "")) for a in mine]
        else:
            accounts = {a.get("Account") for a in mine}
            candidates = [(_number(a.get("GrpSubmit")), a.get("Account", "")) for a in assocs
                          if a.get("Account") in accounts]
        return _reading(candidates, lambda holder: queued.by_account.get(holder, 0),
                        refusal, "association of user " + user)
    names = {job_qos} if job_qos else {q for a in mine for q in
                                       (a.get("QOS", "").split(",") + [a.get("DefaultQOS", "")]) if q}
    column = {LimitScope.QOS_USER: "MaxSubmitPU", LimitScope.QOS_ACCOUNT: "MaxSubmitPA",
              LimitScope.QOS_GROUP: "GrpSubmit"}[scope]
    candidates = [(_number(q.get(column)), q.get("Name", "")) for q in _rows(qos, QOS_FORMAT)
                  if q.get("Name") in names]
    return _reading(candidates, lambda holder: queued.by_qos.get(holder, 0), refusal,
                    "QOS " + (", ".join(sorted(names)) or "of user " + user))


def _reading(candidates: list[tuple[int | None, str]], count: Callable[[str], int],
             refusal: SubmitRefusal, where: str) -> LimitReading:
    """The smallest limit found (the one that bites first) and the queued jobs it counts."""
    known = sorted((limit, holder) for limit, holder in candidates if limit is not None)
    if not known:
        return LimitReading(None, None, None, f"no {refusal.field} found for the {where}")
    limit, holder = known[0]
    return LimitReading(limit, holder, count(holder))


def describe_wait(refusal: SubmitRefusal, reading: LimitReading | None, user: str) -> str:
    """The log line of a submission waiting for a slot, e.g. "3 of 3 jobs allowed for user
    dslurm are queued (MaxSubmitJobs of account dev; sbatch: AssocMaxSubmitJobLimit);
    waiting for one to end"."""
    cause = f"sbatch: {refusal.code}"
    if reading is None or reading.limit is None:
        why = reading.problem if reading is not None and reading.problem else "not readable"
        return (f"Slurm refused the submission: a limit on queued jobs was reached ({cause}); "
                f"the limit and the queued count could not be read ({why}); waiting for a "
                "job to end before submitting again")
    whose = {
        LimitScope.ASSOCIATION_USER: f"for user {user}",
        LimitScope.ASSOCIATION_GROUP: f"for account {reading.holder} (all its users)",
        LimitScope.QOS_USER: f"for user {user} in QOS {reading.holder}",
        LimitScope.QOS_ACCOUNT: f"per account in QOS {reading.holder}",
        LimitScope.QOS_GROUP: f"in QOS {reading.holder} (all users)",
    }[refusal.scope] if refusal.scope is not None else ""
    source = (f"{refusal.field} of account {reading.holder}"
              if refusal.scope in (LimitScope.ASSOCIATION_USER, LimitScope.ASSOCIATION_GROUP)
              else f"{refusal.field} of QOS {reading.holder}")
    queued = "?" if reading.queued is None else str(reading.queued)
    if refusal.scope in (LimitScope.ASSOCIATION_USER, LimitScope.QOS_USER):
        return (f"{queued} of {reading.limit} jobs allowed {whose} are queued ({source}; "
                f"{cause}); waiting for one to end")
    # a limit shared with others: squeue --me sees only the user's own share
    return (f"the {reading.limit} jobs allowed {whose} are queued, {queued} of them yours "
            f"({source}; {cause}); waiting for one to end")


def never_fits(reading: LimitReading | None) -> bool:
    """True when the limit read is 0: no job may be queued at all, waiting cannot help."""
    return reading is not None and reading.limit == 0


def submit_limit_argvs() -> dict[str, list[str]]:
    """The queries that say what a submission limit is (read by
    :func:`~dagster_slurm.slurm.submit_limits.parse_limits`): the login user's name, every
    association and QOS with their submit limits, and the user's queued jobs (pending or
    running) with their account and QOS. Sent together, in one round trip."""
    return {
        "user": ["id", "-un"],
        "associations": ["sacctmgr", "--noheader", "--parsable2", "show", "associations",
                         "format=" + ",".join(ASSOC_FORMAT)],
        "qos": ["sacctmgr", "--noheader", "--parsable2", "show", "qos",
                "format=" + ",".join(QOS_FORMAT)],
        "queue": ["squeue", "--noheader", "--me", "--states=PENDING,RUNNING,SUSPENDED",
                  f"--format={QUEUE_FORMAT}"],
    }
