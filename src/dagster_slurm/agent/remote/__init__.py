"""The cluster-side agent: a small stdlib-only program run on the login node.

One library operation is one SSH round trip: the library sends a JSON request with a list of
operations on the program's standard input, and the program answers with one JSON document
on standard output. The program is shipped as a zip archive of this package (see
:mod:`dagster_slurm.agent.bundle`); it needs nothing but ``python3 >= 3.8`` on the login node.

This package is importable by the library as well, so pure parts (the patch language in
:mod:`.patch`, the document rules in :mod:`.document`) are the same code on both sides.

Modules:

* :mod:`.protocol` — request/response envelope, ``requires`` handling, the ``main`` entry point.
* :mod:`.patch` — RFC 6901 pointers and the patch operations of state transactions.
* :mod:`.document` — versioned JSON documents, atomic writes, the ``txn``/``read`` operations.
* :mod:`.lock` — the directory lock with owner records and stale-owner detection.
* :mod:`.files` — ``exec``, ``tail``, ``write_file``, ``mkdir``, ``remove``.
* :mod:`.scheduler` — ``job_status`` and the token-recorded ``submit``.

Constraints (checked by the unit tests): standard library only, Python 3.8 syntax, no
imports from the rest of ``dagster_slurm``.
"""
