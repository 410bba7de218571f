"""Agent operations that talk to Slurm: ``job_status`` and the token-recorded ``submit``.

Stdlib only, Python 3.8+. Parsing of scheduler output stays in the library; the agent only
needs the job id column (first ``|``- or space-separated field of each ``squeue`` line) and
the job id printed by ``sbatch``.

``submit`` guarantees:

* The submission record (``token``, ``status: "submitting"``, ``submitted_at`` from the login
  node's clock, plus the caller's ``record_value``) is written under the state lock *before*
  ``sbatch`` runs; the lock is not held while the scheduler works.
* One token is submitted at most once: if a record already exists for it, ``sbatch`` is not
  run. A record with status ``submitted`` is returned as ``recovered``; any other status gives
  a ``SubmissionInDoubt`` error carrying the record.
* After ``sbatch`` the record is updated under the lock to ``submitted`` (with ``job_id``),
  ``failed`` (non-zero exit) or ``unknown`` (timeout or unparseable output). With
  ``on_submitted`` (``{"path": "/workers/{job_id}", "value": {...}}``) the same transaction
  also writes ``value`` plus ``job_id``, ``token`` and ``submitted_at`` at ``path`` (with
  ``{job_id}`` filled in), so the job's own record appears atomically with its id. The
  submission record is kept (it is what makes a retried token idempotent); pruning old
  records is the caller's business.
* ``guards`` (``test``/``absent`` operations) are checked in the same locked transaction that
  writes the record: when one fails nothing is written, sbatch does not run, and the error
  ``SubmitGuardFailed`` carries the conflict and the document (e.g. the session was closed).
  They are checked again in the transaction that records a submitted job: when one stopped
  holding while sbatch ran (the session was closed meanwhile, and its teardown's cancel by
  name may have run before the job existed), the record says ``cancelled`` with the job id,
  ``on_submitted`` is not written, the job is cancelled (``scancel <job id>``) and
  ``SubmitGuardFailed`` is raised with ``job_id`` and ``cancelled`` (whether scancel
  succeeded). A guard that fails after this transaction is the guard owner's business: its
  teardown then finds the job by name.
* ``release_on`` (strings): when sbatch exits non-zero printing one of them (a refusal the
  caller waits out, such as ``AssocMaxSubmitJobLimit``), the record is removed instead of
  marked ``failed``, so nobody takes the submission for failed and a retry of the same token
  records it afresh. ``SubmitFailed`` is raised all the same, with ``released``.

Non-guarantees: if the agent dies between ``sbatch`` and the second write, the record stays
``submitting``. The job carries the token in its comment (``submit`` refuses an argv without
the token), so the library finds it by parsing ``squeue``'s comment column (``%k``); there is
no dedicated lookup operation. A ``failed`` sbatch may still have queued a job in rare cases
(for example a controller timeout after accepting it); the same lookup settles it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .common import (
    OpContext,
    OpError,
    bad_request,
    get_argv,
    get_number,
    get_str,
    run_command,
)
from .document import locked_transaction
from .patch import get_path, make_pointer, parse_pointer
from .status_cache import lines_of, listed_job_ids, shared_squeue

__all__ = ["listed_job_ids", "op_job_status", "op_submit", "parse_job_id", "squeue_then_sacct"]

STATUS_FILE_LIMIT = 64 * 1024
_TOKEN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_PARSABLE = re.compile(r"^(\d+)(?:;\S+)?$")
_HUMAN = re.compile(r"Submitted batch job (\d+)")


def parse_job_id(stdout: str) -> str | None:
    """The job id printed by ``sbatch`` (``--parsable`` or the default sentence), or None."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        match = _PARSABLE.match(line) or _HUMAN.search(line)
        if match:
            return match.group(1)
    return None


def op_job_status(params: dict, ctx: OpContext) -> dict:
    """``job_status``: one ``squeue``, status files, and one batched ``sacct`` for the rest.

    Parameters: ``squeue_argv``, ``known_ids``, optional ``sacct_argv`` (``--jobs=<ids>`` is
    appended), optional ``status_files`` ({job_id: path}), ``timeout`` per command, optional
    ``shared`` (``{"path", "argv", "max_age", "wait"}``: the answer comes from the user's
    shared squeue answer, see :mod:`.status_cache`; ``squeue_argv`` is then not run, and the
    answer keeps only the lines of ``known_ids``, unless ``shared.all_jobs``).
    Returns ``squeue`` (rc/stdout/stderr, plus ``shared`` {at, age, ran} when shared),
    ``absent_ids`` (known ids not listed by squeue; None when squeue failed),
    ``status_files`` ({job_id: {exists, data}}), ``sacct_ids`` and ``sacct`` (None when not
    run). sacct runs for every absent id, with a status file or not: the scheduler's final
    state decides how a job ended (a job cancelled before its payload started leaves a
    status file saying 0).
    """
    squeue_argv = get_argv(params, "squeue_argv")
    known = params.get("known_ids") or []
    if not isinstance(known, list) or not all(isinstance(i, (str, int)) for i in known):
        raise bad_request("parameter 'known_ids' must be a list of job ids")
    known_ids = [str(i) for i in known]
    timeout = get_number(params, "timeout", 60.0)
    files = params.get("status_files") or {}
    if not isinstance(files, dict) or not all(isinstance(p, str) and p for p in files.values()):
        raise bad_request("parameter 'status_files' must map job ids to paths")
    shared = params.get("shared")
    squeue = None
    if shared is not None:
        if not isinstance(shared, dict):
            raise bad_request("parameter 'shared' must be an object with path and argv")
        squeue = shared_squeue(shared, known_ids, timeout, _run_quietly, warnings=ctx.warnings)
        if not shared.get("all_jobs"):
            squeue["stdout"] = lines_of(squeue.get("stdout") or "", known_ids)
    result = squeue_then_sacct(params, squeue_argv, known_ids, timeout, squeue=squeue)
    # Status files are read after squeue: a job squeue no longer lists has written its file.
    result["status_files"] = {str(k): read_status_file(v) for k, v in files.items()}
    return result


def squeue_then_sacct(params: dict, squeue_argv: list, known_ids: list, timeout: float,
                      squeue: dict | None = None) -> dict:
    """One ``squeue`` (or the answer ``squeue`` already got); when it answered, the
    ``known_ids`` it did not list (``absent_ids``) and, with ``params["sacct_argv"]``, one
    ``sacct --jobs=<those ids>``. A header line (``JOBID|...``, from ``squeue --Format``) is
    skipped when reading the listed ids."""
    if squeue is None:
        squeue = _run_quietly(squeue_argv, timeout)
    result = {"squeue": squeue, "absent_ids": None, "sacct_ids": [], "sacct": None}
    if squeue["rc"] != 0:
        return result
    lines = squeue["stdout"].splitlines()
    if lines and lines[0].split("|", 1)[0].strip().upper() == "JOBID":
        lines = lines[1:]
    present = listed_job_ids("\n".join(lines), known_ids)
    absent = [i for i in known_ids if i not in present]
    result["absent_ids"] = absent
    if params.get("sacct_argv") and absent:
        sacct_argv = get_argv(params, "sacct_argv") + ["--jobs=" + ",".join(absent)]
        result["sacct_ids"] = absent
        result["sacct"] = _run_quietly(sacct_argv, timeout)
    return result


def op_submit(params: dict, ctx: OpContext) -> dict:
    """``submit``: record the token, run ``argv`` without the lock, record the outcome.

    Parameters: ``argv``, ``token``, ``state`` ({path, lock, timeout, create,
    max_schema_version}), ``record`` (pointer of the submission record), ``record_value``
    (extra fields), ``on_submitted`` (optional), ``timeout`` (for sbatch). See the module
    docstring for the guarantees.
    """
    argv = get_argv(params, "argv")
    token = get_str(params, "token")
    if not _TOKEN.match(token):
        raise bad_request("token must be 1-128 characters of [A-Za-z0-9._:-]")
    if not any(token in arg for arg in argv):
        raise bad_request("argv must carry the token (as --comment) so the job can be found")
    state = params.get("state")
    if not isinstance(state, dict):
        raise bad_request("parameter 'state' must be an object with path and lock")
    record = get_str(params, "record")
    try:
        tokens = parse_pointer(record)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if not tokens:
        raise bad_request("record must point below the document root")
    value = params.get("record_value") or {}
    if not isinstance(value, dict):
        raise bad_request("parameter 'record_value' must be an object")
    value = dict(value, token=token, status="submitting")
    on_submitted = _on_submitted(params.get("on_submitted"))
    guards = params.get("guards") or []
    if not isinstance(guards, list) or not all(
        isinstance(g, dict) and g.get("op") in ("test", "absent") for g in guards
    ):
        raise bad_request("parameter 'guards' must be a list of test/absent operations")

    release_on = params.get("release_on") or []
    if not isinstance(release_on, list) or not all(isinstance(t, str) and t for t in release_on):
        raise bad_request("parameter 'release_on' must be a list of non-empty strings")

    existing = _record_intent(state, ctx, tokens, value, record, guards)
    if existing is not None:
        return existing
    outcome = _run_sbatch(argv, get_number(params, "timeout", 120.0))
    if _refused_for(outcome, release_on):
        return _release(state, ctx, tokens, value, outcome)
    return _record_outcome(state, ctx, tokens, value, outcome, on_submitted, guards)


def _refused_for(out: dict, release_on: list) -> bool:
    """sbatch ran, exited non-zero and printed one of ``release_on`` (a refusal that queued
    nothing, e.g. a limit on queued jobs the caller will wait out)."""
    if out["status"] != "failed" or out["rc"] is None:
        return False
    text = (out.get("stderr") or "") + (out.get("stdout") or "")
    return any(marker in text for marker in release_on)


def _release(state: dict, ctx: OpContext, tokens: list, value: dict, out: dict) -> dict:
    """Remove the token's record after a refusal named in ``release_on`` (as if nothing had
    been submitted: others see no failed submission, a retry records the token afresh) and
    raise ``SubmitFailed`` with ``released``."""
    record = make_pointer(*tokens)
    patch = [{"op": "test", "path": record + "/token", "value": value["token"]},
             {"op": "remove", "path": record}]
    released = True
    try:
        locked_transaction(state, ctx, lambda _d, _n: patch, f"release {value['token']}")
    except OpError as exc:
        released = False
        ctx.warnings.append(f"refused submission's record not removed ({exc.type}): {exc.message}")
    raise OpError(
        "SubmitFailed", f"{out['status']}: {(out.get('stderr') or '').strip()[-500:]}",
        job_id=None, status=out["status"], rc=out["rc"], stdout=out.get("stdout", ""),
        stderr=out.get("stderr", ""), recovered=False, recorded=False, released=released,
    )


def _record_intent(state: dict, ctx: OpContext, tokens: list, value: dict, record: str,
                   guards: list = ()):
    patch = list(guards) + _parents(tokens) + [
        {"op": "absent", "path": record},
        {"op": "add", "path": record, "value": value},
        {"op": "add", "path": record + "/submitted_at", "value_now": 0},
    ]
    try:
        locked_transaction(state, ctx, lambda _d, _n: patch, f"submit {value['token']}")
    except OpError as exc:
        conflict = exc.fields.get("conflict") or {}
        if exc.type != "Conflict":
            raise
        if conflict.get("index", len(guards)) < len(guards):
            raise OpError(
                "SubmitGuardFailed",
                f"not submitted: guard {conflict.get('op')} does not hold",
                conflict=conflict, doc=exc.fields.get("doc"), version=exc.fields.get("version"),
            ) from None
        if conflict.get("op", {}).get("op") != "absent":
            raise
        found = conflict.get("actual")
        if isinstance(found, dict) and found.get("status") == "submitted" and found.get("job_id"):
            return {
                "job_id": str(found["job_id"]),
                "status": "submitted",
                "recovered": True,
                "recorded": True,
                "rc": None,
                "stdout": "",
                "stderr": "",
                "doc": exc.fields.get("doc"),
                "version": exc.fields.get("version"),
            }
        raise OpError(
            "SubmissionInDoubt",
            f"token {value['token']} already has a submission record with status "
            f"{found.get('status') if isinstance(found, dict) else found!r}; "
            "look the job up by its comment before submitting again",
            record=found,
            doc=exc.fields.get("doc"),
            version=exc.fields.get("version"),
        ) from None
    return None


def _run_sbatch(argv: list, timeout: float) -> dict:
    try:
        out = run_command(argv, timeout=timeout)
    except OpError as exc:
        # not started (failed: no job) or timed out (unknown: the job may exist)
        stderr = (exc.fields.get("stderr", "") + "\n" + exc.message).strip()
        return {
            "rc": None,
            "stdout": exc.fields.get("stdout", ""),
            "stderr": stderr,
            "job_id": None,
            "status": "unknown" if exc.type == "CommandTimeout" else "failed",
        }
    job_id = parse_job_id(out["stdout"]) if out["rc"] == 0 else None
    out["job_id"] = job_id
    out["status"] = "submitted" if job_id else ("failed" if out["rc"] != 0 else "unknown")
    return out


def _on_submitted(spec: object) -> dict | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("value", {}), dict):
        raise bad_request("on_submitted must be an object with 'path' and 'value'")
    template = get_str(spec, "path")
    try:
        tokens = parse_pointer(template.replace("{job_id}", "0"))
    except ValueError as exc:
        raise bad_request(f"on_submitted path: {exc}") from None
    if not tokens or "{job_id}" not in template:
        raise bad_request("on_submitted path must contain {job_id} below the document root")
    return {"path": template, "value": spec.get("value") or {}}


def _job_record_patch(on_submitted: dict, job_id: str, token: str, record: str) -> Callable:
    """Builds (from the document under the lock) the patch writing the job's own record."""
    target = on_submitted["path"].replace("{job_id}", job_id)
    tokens = parse_pointer(target)
    value = dict(on_submitted["value"], job_id=job_id, token=token)

    def build(doc: dict | None, _now: float) -> list:
        submission = get_path(doc or {}, record) or {}
        job_value = dict(value, submitted_at=submission.get("submitted_at"))
        return _parents(tokens) + [{"op": "add", "path": target, "value": job_value}]

    return build


def _record_outcome(
    state: dict, ctx: OpContext, tokens: list, value: dict, out: dict, on_submitted: dict | None,
    guards: list = (),
) -> dict:
    record = make_pointer(*tokens)
    fields = {"status": out["status"], "job_id": out["job_id"], "rc": out["rc"]}
    if out["status"] != "submitted":
        fields["error"] = (out.get("stderr") or out.get("stdout") or "")[-2000:]
    patch = _parents(tokens) + [{"op": "setdefault", "path": record, "value": value}]
    patch += [{"op": "add", "path": f"{record}/{k}", "value": v} for k, v in fields.items()]
    patch.append({"op": "add", "path": record + "/finished_at", "value_now": 0})
    extra = None
    if on_submitted is not None and out["status"] == "submitted":
        extra = _job_record_patch(on_submitted, out["job_id"], value["token"], record)
    result = {
        "job_id": out["job_id"],
        "status": out["status"],
        "rc": out["rc"],
        "stdout": out.get("stdout", ""),
        "stderr": out.get("stderr", ""),
        "recovered": False,
        "recorded": False,
    }
    # the guards are checked again when a job was queued (see the module docstring)
    checked = list(guards) if out["status"] == "submitted" else []
    try:
        written = locked_transaction(
            state,
            ctx,
            lambda doc, now: checked + patch + (extra(doc, now) if extra else []),
            f"submit {value['token']}",
        )
        result.update(recorded=True, doc=written["doc"], version=written["version"])
    except OpError as exc:
        conflict = exc.fields.get("conflict") or {}
        if checked and exc.type == "Conflict" and conflict.get("index", len(checked)) < len(checked):
            return _cancel_unguarded(state, ctx, tokens, value, out, conflict)
        ctx.warnings.append(f"submission outcome not recorded ({exc.type}): {exc.message}")
    if out["status"] != "submitted":
        raise OpError(
            "SubmitFailed", f"{out['status']}: {(out.get('stderr') or '').strip()[-500:]}", **result
        )
    return result


def _cancel_unguarded(state: dict, ctx: OpContext, tokens: list, value: dict, out: dict,
                      conflict: dict) -> dict:
    """sbatch queued ``out["job_id"]`` while a guard stopped holding: record it ``cancelled``
    (without the job's own record), cancel it, raise ``SubmitGuardFailed``."""
    job_id = out["job_id"]
    record = make_pointer(*tokens)
    patch = _parents(tokens) + [{"op": "setdefault", "path": record, "value": value}] + [
        {"op": "add", "path": f"{record}/{k}", "value": v}
        for k, v in (("status", "cancelled"), ("job_id", job_id), ("rc", out["rc"]),
                     ("error", "a guard stopped holding while sbatch ran; the job was cancelled"))
    ] + [{"op": "add", "path": record + "/finished_at", "value_now": 0}]
    try:
        locked_transaction(state, ctx, lambda _d, _n: patch, f"submit {value['token']}")
    except OpError as exc:
        ctx.warnings.append(f"cancelled submission not recorded ({exc.type}): {exc.message}")
    cancel = _run_quietly(["scancel", str(job_id)], 60.0)
    if cancel.get("rc") != 0:
        ctx.warnings.append(f"scancel {job_id} failed: {(cancel.get('stderr') or '').strip()}")
    raise OpError(
        "SubmitGuardFailed",
        f"job {job_id} was submitted while guard {conflict.get('op')} stopped holding; "
        + ("it was cancelled" if cancel.get("rc") == 0 else "cancelling it failed"),
        conflict=conflict, job_id=str(job_id), cancelled=cancel.get("rc") == 0,
    )


def _parents(tokens: list) -> list:
    return [
        {"op": "setdefault", "path": make_pointer(*tokens[:i]), "value": {}}
        for i in range(1, len(tokens))
    ]


def _run_quietly(argv: list, timeout: float) -> dict:
    try:
        return run_command(argv, timeout=timeout)
    except OpError as exc:
        out = {"rc": None, "stdout": exc.fields.get("stdout", ""), "stderr": exc.message}
        out["error"] = exc.type
        return out


def read_status_file(path: str) -> dict:
    """The start of one small file (at most ``STATUS_FILE_LIMIT`` bytes), as the agent answers it.

    ``{"exists": True, "data": text}`` (decoded as UTF-8, undecodable bytes replaced);
    ``{"exists": False, "data": None}`` when there is no such file, with ``"error"`` added
    when it cannot be read for another reason.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(STATUS_FILE_LIMIT)
    except FileNotFoundError:
        return {"exists": False, "data": None}
    except OSError as exc:
        return {"exists": False, "data": None, "error": str(exc)}
    return {"exists": True, "data": data.decode("utf-8", "replace")}
