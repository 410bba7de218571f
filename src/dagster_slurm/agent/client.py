"""Client of the cluster-side agent: one transport round trip per request.

Usage::

    client = AgentClient(transport, "/scratch/me/dagster")
    result = client.run(txn_op(path, lock, patch))          # one op, one round trip
    with client.batch() as batch:                            # several ops, one round trip
        saved = batch.add(txn_op(path, lock, patch))
        listed = batch.add(exec_op(["squeue", "--me"]), requires=[saved])
    saved.result(), listed.result()

Guarantees:

* Steady state is exactly one ``transport.run`` per request (observable in
  ``transport.stats.round_trips``): a ``sh`` one-liner checks that the program exists and
  runs the configured python on it (``exec``), with the request on standard input.
* The program is installed as the directory ``<base_path>/.dagster-slurm/agent-<sha256
  prefix>`` (see :mod:`~dagster_slurm.agent.bundle`), named by the hash of its archive: the
  first request of a new program version finds no directory (exit status 97), installs it in
  one more round trip and is retried once. Installation unpacks into a temporary directory
  next to the target and renames it into place, so concurrent installers and callers never
  see a partial program; the installer checks the archive's hash first.
* Failed operations raise :class:`~dagster_slurm.agent.exceptions.AgentOpError` subclasses
  carrying the agent's message (a lock timeout is a
  :class:`~dagster_slurm.errors.LockTimeout`); warnings from the agent are logged on the
  ``dagster_slurm.agent`` logger and kept on the results.

* With ``persistent=True`` (what :class:`~dagster_slurm.SlurmResource` uses) requests go
  to long-lived agent processes in serve mode (see :mod:`~dagster_slurm.agent.stream`): one
  line out, one line back on an open channel, no interpreter start per request. They end
  with :meth:`AgentClient.close`, the transport's connection or the calling process.

* With ``learn_slurm_version`` (what :class:`~dagster_slurm.SlurmResource` uses) the Slurm
  release of the login node is learnt once per client (one connection's worth of
  requests), in the first request's round trip: that request carries ``hello`` and the
  agent adds the first line of ``squeue --version`` to its answer (no round trip, no
  scheduler RPC of its own). :attr:`AgentClient.slurm_version` is None until then; it is
  logged once as ``Slurm 24.11.5 at <host>``.

Non-guarantees: the client does not retry requests after a transport error; whether an
operation ran is then unknown (submissions carry tokens for that reason).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dagster_slurm.agent.bundle import AgentProgram, default_program
from dagster_slurm.agent.exceptions import AgentProtocolError
from dagster_slurm.agent.ops import AgentOp
from dagster_slurm.agent.stream import NOT_INSTALLED, AgentStreamPool
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.version import SlurmVersion, parse_slurm_version
from dagster_slurm.transport.base import CommandResult, Transport

log = logging.getLogger("dagster_slurm.agent")

PROTOCOL_VERSION = 1
NOT_INSTALLED_EXIT = 97
INSTALL_DIR = ".dagster-slurm"
_LAUNCH = '[ -f "$1/__main__.py" ] || exit 97; exec "$2" -I -S "$1"'
# Run by the login node's python (3.8+): argv = [target directory, expected sha256].
_INSTALL = """
import hashlib, io, os, shutil, sys, zipfile
target, expected = sys.argv[1], sys.argv[2]
data = sys.stdin.buffer.read()
if hashlib.sha256(data).hexdigest() != expected:
    sys.exit("received archive does not match its hash (truncated transfer?)")
os.umask(0o022)
os.makedirs(os.path.dirname(target), exist_ok=True)
tmp = "%s.tmp.%d.%s" % (target, os.getpid(), os.urandom(4).hex())  # pids repeat across login nodes
try:
    zipfile.ZipFile(io.BytesIO(data)).extractall(tmp)
    try:
        os.rename(tmp, target)
    except OSError:
        if not os.path.isfile(os.path.join(target, "__main__.py")):
            raise
finally:
    shutil.rmtree(tmp, ignore_errors=True)
"""

R = TypeVar("R")


@dataclass(frozen=True)
class AgentResponse:
    """The agent's answer: one raw result per op, the login node's clock, the command result."""

    results: list[dict[str, Any]]
    now: float
    command: CommandResult
    slurm_version: dict[str, Any] | None = None
    """The answer to the request's ``hello`` (``{"text": ...}``); None without one."""


class AgentClient:
    """Runs agent requests through a :class:`~dagster_slurm.transport.base.Transport`.

    ``base_path`` is a directory on the cluster (absolute, or relative to the login
    directory; ``~`` is not expanded). ``python`` is the interpreter command (one word or a
    path) on the login node; it must be Python 3.8 or newer.
    """

    def __init__(
        self,
        transport: Transport,
        base_path: str,
        python: str = "python3",
        *,
        program: AgentProgram | None = None,
        timeout_margin: float = 30.0,
        persistent: bool = False,
        max_streams: int = 2,
        where: str = "the login node",
        learn_slurm_version: bool = False,
    ) -> None:
        if not base_path or base_path.startswith("~"):
            raise ConfigurationError(
                "base_path", base_path, "must be a non-empty path without a leading '~'"
            )
        self.transport = transport
        self.python = python
        self.program = program or default_program()
        self.install_dir = f"{base_path.rstrip('/') or '/'}/{INSTALL_DIR}"
        self.program_path = f"{self.install_dir}/{self.program.name}"
        self.timeout_margin = timeout_margin
        #: Names the login node in logs (``Slurm 24.11.5 at <where>``).
        self.where = where
        self._slurm_version: SlurmVersion | None = None
        self._slurm_version_text: str | None = None
        self._hello_answered = not learn_slurm_version
        self._hello_lock = threading.Lock()
        self._pool: AgentStreamPool | None = None
        if persistent and hasattr(transport, "open_stream"):
            argv = ["sh", "-c", _LAUNCH + " --serve", "sh", self.program_path, self.python]
            self._pool = AgentStreamPool(
                transport, argv, not_installed_exit=NOT_INSTALLED_EXIT, max_streams=max_streams
            )

    def call(
        self, requests: Sequence[Mapping[str, Any]], *, timeout: float | None = None
    ) -> AgentResponse:
        """Send raw op objects in one request; returns the raw results (no error mapping).

        Raises :class:`AgentProtocolError` when the request is rejected as a whole or the
        answer cannot be read, and the transport's errors when the round trip fails.
        """
        request: dict[str, Any] = {"protocol": PROTOCOL_VERSION, "ops": list(requests)}
        if not self._hello_answered:
            request["hello"] = True
        payload = json.dumps(request).encode()
        limit = timeout if timeout is not None else 60.0 + self.timeout_margin
        result = self._launch(payload, limit)
        if result.exit_code == NOT_INSTALLED_EXIT:
            self.install()
            result = self._launch(payload, limit)
            if result.exit_code == NOT_INSTALLED_EXIT:
                raise AgentProtocolError(
                    f"agent program {self.program_path} is still missing after installing it",
                    result,
                )
        response = self._decode(result, len(requests))
        if "hello" in request:
            self._learn_version(response.slurm_version)
        for index, raw in enumerate(response.results):
            for warning in raw.get("warnings") or ():
                log.warning("agent op %d (%s): %s", index, requests[index].get("op"), warning)
        return response

    @property
    def slurm_version(self) -> SlurmVersion | None:
        """The login node's Slurm release, once a request has answered; None before, or
        when ``squeue --version`` gave nothing readable."""
        return self._slurm_version

    @property
    def slurm_version_text(self) -> str | None:
        """What ``squeue --version`` printed (e.g. ``slurm-wlm 22.05.8``), or None."""
        return self._slurm_version_text

    def _learn_version(self, answer: Mapping[str, Any] | None) -> None:
        with self._hello_lock:  # two first requests in parallel: the first answer counts
            if self._hello_answered:
                return
            self._hello_answered = True
        text = answer.get("text") if isinstance(answer, Mapping) else None
        self._slurm_version_text = text if isinstance(text, str) else None
        self._slurm_version = parse_slurm_version(self._slurm_version_text)
        if self._slurm_version is not None:
            log.info("Slurm %s at %s", self._slurm_version, self.where)
        elif answer is None:  # an agent that does not answer hello (a test double)
            log.debug("no Slurm release from the agent at %s", self.where)
        else:
            error = answer.get("error")
            log.warning("the Slurm release at %s is not known (squeue --version: %s); the "
                        "commands of Slurm 22.05 are used", self.where, error or text)

    def run(self, op: AgentOp[R], *, timeout: float | None = None) -> R:
        """Run one operation in one round trip and return its typed result."""
        response = self.call([op.to_request()], timeout=self.budget([op], timeout))
        return op.decode(response.results[0], 0)

    def batch(self) -> Batch:
        """A batch of operations sent in one round trip (see :class:`Batch`)."""
        return Batch(self)

    def install(self) -> None:
        """Unpack the program into :attr:`program_path` (one round trip, atomic rename)."""
        argv = [self.python, "-I", "-S", "-c", _INSTALL, self.program_path, self.program.sha256]
        result = self.transport.run(argv, stdin=self.program.data, timeout=120.0)
        if not result.ok:
            raise AgentProtocolError(
                f"could not install the agent at {self.program_path}: "
                f"exit {result.exit_code}: {result.stderr.strip()[-1000:]}",
                result,
            )
        log.info("installed the cluster-side agent at %s", self.program_path)

    def budget(self, ops: Sequence[AgentOp[Any]], timeout: float | None = None) -> float:
        """Round-trip timeout for ``ops``: ``timeout`` if given, else their budgets + margin."""
        if timeout is not None:
            return timeout
        return sum(op.budget_s for op in ops) + self.timeout_margin

    def _launch(self, payload: bytes, timeout: float) -> CommandResult:
        if self._pool is not None:
            start = time.monotonic()
            answer = self._pool.request(payload + b"\n", timeout)
            if answer is NOT_INSTALLED:
                return CommandResult("agent --serve", NOT_INSTALLED_EXIT, "", "", 0.0)
            assert isinstance(answer, bytes)
            text = answer.decode("utf-8", "replace")
            return CommandResult("agent --serve", 0, text, "", time.monotonic() - start)
        argv = ["sh", "-c", _LAUNCH, "sh", self.program_path, self.python]
        return self.transport.run(argv, stdin=payload, timeout=timeout)

    def close(self) -> None:
        """End the persistent agent processes, if any (the client stays usable)."""
        if self._pool is not None:
            self._pool.close()

    def _decode(self, result: CommandResult, expected: int) -> AgentResponse:
        try:
            response = json.loads(result.stdout)
        except ValueError:
            response = None
        if not isinstance(response, dict):
            raise AgentProtocolError(
                f"agent {self.program_path} (python {self.python!r}) exited with code "
                f"{result.exit_code} without a readable answer: "
                f"{(result.stderr or result.stdout).strip()[-2000:]}",
                result,
            )
        error = response.get("error")
        if isinstance(error, dict):
            raise AgentProtocolError(
                f"agent rejected the request ({error.get('type')}): {error.get('message')}",
                result,
            )
        results = response.get("results")
        if result.exit_code != 0 or not isinstance(results, list) or len(results) != expected:
            raise AgentProtocolError(
                f"unexpected agent answer (exit {result.exit_code}, "
                f"{len(results) if isinstance(results, list) else 'no'} results "
                f"for {expected} ops)",
                result,
            )
        version = response.get("slurm_version")
        return AgentResponse(results, float(response.get("now") or 0.0), result,
                             version if isinstance(version, dict) else None)


class PendingResult(Generic[R]):
    """The future result of an op added to a :class:`Batch`."""

    def __init__(self, batch: Batch, op: AgentOp[R], index: int, requires: tuple[int, ...]) -> None:
        self._batch = batch
        self.op = op
        self.index = index
        self.requires = requires
        self.raw: Mapping[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """Whether the op succeeded (False before the batch ran)."""
        return bool(self.raw and self.raw.get("ok"))

    def result(self) -> R:
        """The typed result; raises the op's error (e.g. ``OpSkipped``) like ``client.run``."""
        if self.raw is None:
            raise RuntimeError("the batch has not been run yet")
        return self.op.decode(self.raw, self.index)

    def belongs_to(self, batch: Batch) -> bool:
        """Whether this is the result of an op added to ``batch`` (and not to another one)."""
        return self._batch is batch


class Batch:
    """Operations collected and sent in one request; ``with`` runs it on a clean exit.

    Ops run in the order added. ``requires`` makes an op depend on earlier ones of the same
    batch: it is skipped unless they all succeeded.
    """

    def __init__(self, client: AgentClient) -> None:
        self._client = client
        self._pending: list[PendingResult[Any]] = []
        self.response: AgentResponse | None = None

    def add(
        self, op: AgentOp[R], *, requires: Sequence[PendingResult[Any]] = ()
    ) -> PendingResult[R]:
        for dependency in requires:
            if not dependency.belongs_to(self):
                raise ValueError("requires may only name ops of the same batch")
        if self.response is not None:
            raise RuntimeError("this batch has already been run")
        indices = tuple(d.index for d in requires)
        pending = PendingResult(self, op, len(self._pending), indices)
        self._pending.append(pending)
        return pending

    def run(self, *, timeout: float | None = None) -> AgentResponse | None:
        """Send the batch (one round trip; none when empty) and fill in every result."""
        if self.response is not None:
            raise RuntimeError("this batch has already been run")
        if not self._pending:
            return None
        ops = [p.op for p in self._pending]
        requests = [p.op.to_request(p.requires) for p in self._pending]
        response = self._client.call(requests, timeout=self._client.budget(ops, timeout))
        for pending, raw in zip(self._pending, response.results, strict=True):
            pending.raw = raw
        self.response = response
        return response

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None and self.response is None:
            self.run()
