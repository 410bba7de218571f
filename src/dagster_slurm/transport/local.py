"""A :class:`~dagster_slurm.transport.base.Transport` that runs commands as local subprocesses.

Used by local mode and by unit tests of code that talks to the cluster-side agent.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence

from dagster_slurm.errors import CommandTimeout, TransportError
from dagster_slurm.transport.base import CommandResult, TransportStats, render_command


class LocalTransport:
    """Runs each argv with :func:`subprocess.run` (no shell) on this machine."""

    def __init__(self, default_timeout: float = 300.0) -> None:
        self.default_timeout = default_timeout
        self.stats = TransportStats()

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        command = render_command(argv, env)
        limit = self.default_timeout if timeout is None else timeout
        full_env = None if not env else {**os.environ, **env}
        start = time.monotonic()
        try:
            proc = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=limit,
                env=full_env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(f"{command!r} did not finish within {limit:.0f} s") from exc
        except OSError as exc:
            raise TransportError(f"could not run {command!r}: {exc}") from exc
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace")
        self.stats.record(argv[0], len(stdin or b""), len(proc.stdout) + len(proc.stderr))
        return CommandResult(command, proc.returncode, out, err, time.monotonic() - start)

    def close(self) -> None:
        """Nothing to release."""
