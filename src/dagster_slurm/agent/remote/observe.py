"""Agent operation ``observe_session``: one look at a run session, in one round trip.

Stdlib only, Python 3.8+.

A run session's allocations (head, successor, worker allocations) share its Slurm job name,
so one ``squeue --name`` lists them all. Which jobs the session knows, and which small files
describe them, is in the session document; this operation reads the document (without the
lock: a snapshot), runs that one ``squeue``, runs ``sacct`` once for the known jobs squeue no
longer lists, and reads the named files of every known job, so that the library's
``session.inspect()`` costs one SSH round trip whatever the number of allocations.

Parameters: ``path`` (the session document), ``squeue_argv``, optional ``sacct_argv``
(``--jobs=<ids>`` is appended), ``jobs_dir`` and ``job_files`` (file names read from
``<jobs_dir>/<job id>/`` for every known job), ``files`` (more paths, read as they are),
``timeout`` per command. Returns ``doc``, ``version``, ``known_ids``, ``squeue``
(rc/stdout/stderr), ``absent_ids`` (known ids squeue did not list; None when squeue failed),
``sacct_ids``, ``sacct`` (None when not run) and ``files`` ({path: {exists, data}}).

Known jobs: the job ids of ``/allocation`` and ``/successor``, and of every ``/workers``
record not marked ``released``.
"""

from __future__ import annotations

from .common import OpContext, bad_request, get_argv, get_number, get_str
from .document import document_version, read_document
from .scheduler import read_status_file, squeue_then_sacct


def known_job_ids(doc: object) -> list:
    """The job ids a session document knows (see the module docstring), in document order."""
    if not isinstance(doc, dict):
        return []
    ids = []
    for key in ("allocation", "successor"):
        record = doc.get(key)
        if isinstance(record, dict) and record.get("job_id"):
            ids.append(str(record["job_id"]))
    workers = doc.get("workers")
    if isinstance(workers, dict):
        for job_id, record in workers.items():
            if isinstance(record, dict) and not record.get("released"):
                ids.append(str(job_id))
    return list(dict.fromkeys(ids))


def op_observe_session(params: dict, ctx: OpContext) -> dict:
    """``observe_session``; see the module docstring."""
    path = get_str(params, "path")
    squeue_argv = get_argv(params, "squeue_argv")
    timeout = get_number(params, "timeout", 60.0)
    names = params.get("job_files") or []
    extra = params.get("files") or []
    if not isinstance(names, list) or not all(
        isinstance(n, str) and n and "/" not in n for n in names
    ):
        raise bad_request("parameter 'job_files' must list plain file names")
    if not isinstance(extra, list) or not all(isinstance(p, str) and p for p in extra):
        raise bad_request("parameter 'files' must list paths")
    jobs_dir = get_str(params, "jobs_dir") if names else ""
    doc = read_document(path)
    known = known_job_ids(doc)
    result = {"doc": doc, "version": document_version(doc), "known_ids": known,
              **squeue_then_sacct(params, squeue_argv, known, timeout)}
    # Files are read after squeue: a job squeue no longer lists has written its last words.
    paths = [f"{jobs_dir}/{job_id}/{name}" for job_id in known for name in names] + list(extra)
    result["files"] = {p: read_status_file(p) for p in dict.fromkeys(paths)}
    return result

