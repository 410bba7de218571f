"""One ``squeue`` answer per user, shared by every process of that user on the login node.

Stdlib only, Python 3.8+; runs on the login node inside the cluster-side agent.

Every process that follows jobs polls the scheduler. Without sharing, fifty concurrent runs
of one user cost fifty times the RPCs a single run costs. Here the poll of ``job_status``
with a ``shared`` parameter is served from a small file in the deployment base that holds
the last answer of one ``squeue`` listing all of the user's jobs (``squeue --me``), at the
requested path with ``{uid}`` replaced by the login user's numeric id:

``{"at": <login-node epoch seconds, read just before squeue ran>, "argv": [...], "rc": ...,
"stdout": "...", "stderr": "..."}``, written atomically (a temporary file, then a rename),
0600 in a 0700 directory (it lists the user's jobs and their comments).

A request started at ``t`` accepts the file when it is fresh enough, ``at >= t - max_age``,
and lists every job id the request knows; a job the answer does not list may have been
submitted after it was taken, so then only an answer taken after ``t`` is good enough. Such
an answer is produced by one process at a time: the first to take the refresh lock (the
agent's ``mkdir`` lock next to the file) reads the file again (another process may just
have refreshed it) and otherwise runs squeue and writes the file; the others wait for the
lock and then read what it wrote. So however many processes poll, the user's squeue rate
is at most one per ``max_age`` plus one per moment at which a newly submitted or finished
job needs a newer answer, and concurrent needs share one squeue.

Many pollers: a request that needs a newer answer than the file holds, while the file was
last refreshed by another process (``by``: the requesting client's id), waits until
``floor`` seconds after that refresh before it refreshes, and is served whatever another
process took in the meantime. With several processes polling, the user's squeue rate is
then at most one per ``floor`` seconds, however many jobs start or end; a lone process
(the last refresh was its own) is never held back by it.

A failed squeue (the controller does not answer) is shared as well: for ``max_age`` the
other processes get the same failure instead of each adding a call to a struggling
controller. A failure never turns into an absence: the caller treats it as unknown.

Fail safe: when the file cannot be read or written, or the lock is not free within
``wait`` seconds (a holder on another login node that died), the request runs its own
squeue, so a poll is never lost to the cache.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from . import lock as dirlock
from .common import OpError, bad_request, get_number, get_str
from .document import write_atomic

#: Largest cache file read (a user with very many jobs still gets an answer, uncached).
MAX_CACHE_BYTES = 16 * 1024 * 1024


def shared_squeue(
    spec: dict,
    known_ids: list,
    timeout: float,
    run: Callable[[list, float], dict],
    clock: Callable[[], float] = time.time,
    warnings: list | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """The squeue answer for a request that knows ``known_ids``, served from the shared
    file of ``spec`` (``{"path", "argv", "max_age", "wait", "floor", "client"}``) when it is
    good enough, else refreshed by one process (see the module docstring). ``run(argv, timeout)`` runs squeue
    and returns ``{"rc", "stdout", "stderr"}``. The answer has the same fields plus
    ``shared``: ``{"at", "age", "ran"}`` (``ran``: this request ran the squeue)."""
    path = get_str(spec, "path").replace("{uid}", str(os.getuid()))
    argv = spec.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise bad_request("shared.argv must be a non-empty list of strings")
    max_age = get_number(spec, "max_age", 2.0)
    wait = get_number(spec, "wait", timeout + 5.0)
    floor = get_number(spec, "floor", 0.0)
    client = spec.get("client") if isinstance(spec.get("client"), str) else None
    started = clock()
    cached = _read(path, argv)
    if cached is not None and cached["at"] >= started - max_age and _covers(cached, known_ids):
        return _served(cached, started, ran=False)
    if cached is not None and floor > 0 and cached.get("by") != client:
        # Another process refreshed last: the user has several pollers. A newer answer is
        # not taken before ``floor`` seconds after that one, and whoever takes it first
        # serves every request that started before it.
        pause = cached["at"] + floor - clock()
        if pause > 0:
            sleep(min(pause, floor))
            cached = _read(path, argv)
            if cached is not None and cached["at"] >= started:
                return _served(cached, started, ran=False)
    try:
        # only a refresh needs the directory (a served poll costs no mkdir on a shared
        # filesystem); without it the lock fails and the request runs its own squeue
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    except OSError:
        pass
    try:
        # the refresh holds the lock while squeue runs: its lease covers squeue's timeout
        with dirlock.locked(path + ".refresh", wait, "squeue refresh", warnings,
                            lease=timeout + dirlock.DEFAULT_LEASE):
            cached = _read(path, argv)
            if cached is not None and cached["at"] >= started:
                return _served(cached, started, ran=False)
            answer = _refresh(path, argv, timeout, run, clock, warnings, client=client)
    except OpError as exc:
        if exc.type not in ("LockTimeout", "LockError"):
            raise
        if warnings is not None:
            warnings.append(f"shared squeue answer not used ({exc.type}): {exc.message}")
        answer = _refresh(path, argv, timeout, run, clock, warnings, write=False)
    return _served(answer, started, ran=True)


def _first_field(line: str) -> str | None:
    """A squeue line's job id column (its first ``|``- or space-separated field), or None."""
    head = line.strip().split("|", 1)[0].split()
    return head[0] if head else None


def _member_of(field: str, job_id: str) -> bool:
    """Whether the id ``field`` is ``job_id`` or one of its array/het members."""
    return field == job_id or field.startswith((job_id + "_", job_id + "+"))


def listed_job_ids(squeue_stdout: str, known_ids: list) -> set:
    """The ``known_ids`` that appear as the first field of a line (array/het suffixes count)."""
    firsts = {f for f in map(_first_field, squeue_stdout.splitlines()) if f}
    return {job_id for job_id in known_ids if any(_member_of(f, job_id) for f in firsts)}


def lines_of(squeue_stdout: str, job_ids: list) -> str:
    """The lines of ``squeue_stdout`` whose first field is one of ``job_ids`` (or one of
    their array/het members): what a request gets of the user-wide answer."""
    kept = []
    for line in squeue_stdout.splitlines():
        field = _first_field(line)
        if field and any(_member_of(field, job_id) for job_id in job_ids):
            kept.append(line)
    return "".join(line + "\n" for line in kept)


def _covers(cached: dict, known_ids: list) -> bool:
    """A failed answer covers everything (it says nothing is known); a good one must list
    every known id as the first field of a line."""
    if cached.get("rc") != 0:
        return True
    return len(listed_job_ids(cached.get("stdout") or "", known_ids)) == len(set(known_ids))


def _refresh(path: str, argv: list, timeout: float, run: Callable[[list, float], dict],
             clock: Callable[[], float], warnings: list | None, write: bool = True,
             client: str | None = None) -> dict:
    at = clock()
    out = run(argv, timeout)
    answer = {"at": at, "argv": argv, "rc": out.get("rc"), "stdout": out.get("stdout", ""),
              "stderr": out.get("stderr", ""), "by": client}
    if "error" in out:
        answer["error"] = out["error"]
    if write:
        try:
            _write(path, answer)
        except OSError as exc:
            if warnings is not None:
                warnings.append(f"shared squeue answer not written to {path}: {exc}")
    return answer


def _served(answer: dict, started: float, ran: bool) -> dict:
    out = {k: answer.get(k) for k in ("rc", "stdout", "stderr")}
    if answer.get("error"):
        out["error"] = answer["error"]
    out["shared"] = {"at": answer["at"], "age": max(0.0, started - answer["at"]), "ran": ran}
    return out


def _read(path: str, argv: list) -> dict | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CACHE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_CACHE_BYTES:
        return None
    try:
        cached = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(cached, dict) or cached.get("argv") != argv:
        return None
    if not isinstance(cached.get("at"), (int, float)) or not isinstance(cached.get("stdout"), str):
        return None
    return cached


def _write(path: str, answer: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    write_atomic(path, json.dumps(answer).encode("utf-8"), mode=0o600, durable=False)
