"""Context injection into a file that travels with the job submission.

:class:`PipesDeferredFileContextInjector` does no I/O. When Dagster opens the Pipes session it
serialises the context data, keeps the bytes on :attr:`~PipesDeferredFileContextInjector.payload`
(and passes them to ``on_payload`` if given) and yields ``{"path": <path>}``: the params the
payload's default context loader (``open_dagster_pipes()`` with no arguments, i.e.
``PipesDefaultContextLoader``) reads the context file from.

The caller writes the file itself, as part of the request that submits the job, so the
context costs no round trip of its own::

    injector = PipesDeferredFileContextInjector(f"{job_dir}/context.json")
    with open_pipes_session(context, injector, reader) as session:
        env = session.get_bootstrap_env_vars()
        with client.batch() as batch:
            batch.add(injector.write_op(makedirs=True))      # the file first ...
            batch.add(submit_op(...), requires=[...])        # ... then the job
        ...

Ordering: the file must exist before the payload starts, i.e. the write must come before the
submission (the same batch, earlier, with the submission ``requires`` it). The payload reads
the file once, in ``open_dagster_pipes()``; afterwards it may be removed with the job
directory. This injector never deletes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dagster import PipesContextInjector
from dagster_pipes import PipesContextData, PipesDefaultContextLoader, PipesParams

from dagster_slurm.agent.ops import AgentOp, write_file_op
from dagster_slurm.agent.results import PathResult

__all__ = ["PipesDeferredFileContextInjector"]


class PipesDeferredFileContextInjector(PipesContextInjector):
    """Serialises the Pipes context for a file the caller writes with the job submission.

    Args:
        path: Where the payload will read the context file (a path on the machine that runs
            the payload; absolute, or relative to the payload's working directory).
        on_payload: Called with the serialised context (UTF-8 JSON bytes) as soon as Dagster
            injects it, before the Pipes session's params are handed out.
    """

    def __init__(self, path: str, on_payload: Callable[[bytes], None] | None = None) -> None:
        if not path:
            raise ValueError("the context file path must not be empty")
        self.path = path
        self._on_payload = on_payload
        self._payload: bytes | None = None

    @property
    def payload(self) -> bytes:
        """The serialised context; available once the Pipes session is open."""
        if self._payload is None:
            raise RuntimeError(
                "no context has been injected yet: open the Pipes session "
                "(open_pipes_session) with this injector first"
            )
        return self._payload

    @property
    def injected(self) -> bool:
        """Whether the context has been serialised (the Pipes session has been opened)."""
        return self._payload is not None

    def write_op(self, *, mode: int = 0o600, makedirs: bool = False) -> AgentOp[PathResult]:
        """The agent operation that writes the context file (add it to the submission batch)."""
        return write_file_op(self.path, self.payload, mode=mode, makedirs=makedirs)

    @contextmanager
    def inject_context(self, context_data: PipesContextData) -> Iterator[PipesParams]:
        """Serialise ``context_data`` and yield the params that point the loader at the file."""
        self._payload = json.dumps(context_data).encode("utf-8")
        if self._on_payload is not None:
            self._on_payload(self._payload)
        yield {PipesDefaultContextLoader.FILE_PATH_KEY: self.path}

    def no_messages_debug_text(self) -> str:
        state = "" if self.injected else " (the context was never serialised)"
        return (
            f"The payload was expected to read its context from the file {self.path}{state}, "
            "written with the job submission; check that it was written before the job "
            "started and that the payload calls open_dagster_pipes()."
        )
