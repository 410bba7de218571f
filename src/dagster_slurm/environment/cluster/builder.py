"""One build of a packed environment on the cluster, by the holder of its build lease.

Three round trips (see :mod:`~dagster_slurm.environment.cluster.remote` for the layout):

1. one agent batch: is ``<hash>/.ready`` there after all (then stop), create the build
   directory, link the wheels the cluster's store has and learn which it lacks;
2. one transport command: ``tar -x`` of a single uncompressed tar stream holding the missing
   files (and requirements.txt) into the build directory;
3. one agent batch: the install commands (each ``exec`` runs only if the previous required
   one succeeded), adding the uploaded wheels to the store, the ``.ready`` marker and the
   publishing symlink.

A build that fails or loses the race to publish removes its own directory.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dagster_slurm.agent.client import AgentClient, PendingResult
from dagster_slurm.agent.exceptions import AgentOpError
from dagster_slurm.agent.ops import AgentOp, exec_op, mkdir_op, remove_op, tail_op, write_file_op
from dagster_slurm.agent.results import ExecResult, TailRequest
from dagster_slurm.environment.cluster.remote import (
    READY,
    WHEELS,
    InstallStep,
    PackFile,
    Recipe,
    RemoteLayout,
    install_steps,
    publish_argv,
    ready_content,
    wheel_store_step,
)
from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.errors import DagsterSlurmError


@dataclass(frozen=True)
class BuildOutcome:
    """What a build did: ``published`` False means another build's environment is used."""

    uploaded_bytes: int
    published: bool
    upload_s: float = 0.0
    install_s: float = 0.0


class RemoteBuild:
    """Builds ``recipe`` into a fresh directory ``<builds>/<hash>.<token>`` and publishes it."""

    def __init__(
        self,
        agent: AgentClient,
        layout: RemoteLayout,
        recipe: Recipe,
        *,
        python: str,
        owner: str,
        token: str,
        install_timeout: float,
        log: logging.Logger | logging.LoggerAdapter,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.agent = agent
        self.layout = layout
        self.recipe = recipe
        self.python = python
        self.owner = owner
        self.token = token
        self.install_timeout = install_timeout
        self.log = log
        self.clock = clock
        self.build_dir = layout.build_dir(token)

    def run(self, upload_budget: float) -> BuildOutcome | None:
        """Build and publish; None when the environment turned out to be ready already."""
        try:
            missing = self._start()
            if missing is None:
                self.remove()
                return None
            files = [
                f for f in self.recipe.files if not f.shared or (f.sha256, f.path.name) in missing
            ]
            upload_start = self.clock()
            sent = self._upload(files, upload_budget)
            install_start = self.clock()
            self.log.info(
                "uploaded %d of %d files (%.1f MB) to %s in %.1f s",
                len(files),
                len(self.recipe.files),
                sent / 1e6,
                self.build_dir,
                install_start - upload_start,
            )
            published = self._install(files)
        except BaseException:
            self.remove()
            raise
        outcome = BuildOutcome(
            sent, published, install_start - upload_start, self.clock() - install_start
        )
        if not published:
            self.remove()
        return outcome

    def remove(self) -> None:
        """Delete this build's directory (best effort: failures are logged)."""
        try:
            self.agent.run(remove_op(self.build_dir, root=self.layout.builds_dir))
        except DagsterSlurmError as exc:
            self.log.warning("could not remove the unfinished build %s: %s", self.build_dir, exc)

    def _start(self) -> set[tuple[str, str]] | None:
        """Round trip 1; returns the (sha256, name) pairs of shared files to upload."""
        pairs = self.recipe.shared_pairs()
        link = wheel_store_step("link", self.layout, self.build_dir, self.python, pairs)
        with self.agent.batch() as batch:
            ready = batch.add(tail_op([TailRequest(self.layout.ready_marker, 0, 1)]))
            made = batch.add(mkdir_op(f"{self.build_dir}/{WHEELS}"))
            linked = batch.add(_exec(link), requires=[made]) if pairs else None
        if ready.result().files[0].exists:
            return None
        made.result()
        if linked is None:
            return set()
        result = self._check(link, linked)
        return {(sha, name) for sha, name in json.loads(result.stdout)}

    def _upload(self, files: Sequence[PackFile], budget: float) -> int:
        """Round trip 2: one tar stream, unpacked into the build directory."""
        data = tar_bytes(self.recipe.generated, files)
        result = self.agent.transport.run(
            ["tar", "-x", "-f", "-", "-C", self.build_dir],
            stdin=data,
            timeout=budget,
        )
        if not result.ok:
            raise EnvironmentSetupError(
                f"uploading the environment to {self.build_dir} failed (tar exit "
                f"{result.exit_code}): {result.stderr.strip()[-2000:]}"
            )
        return len(data)

    def _install(self, uploaded: Sequence[PackFile]) -> bool:
        """Round trip 3; False when another build published first."""
        steps = list(install_steps(self.recipe, self.build_dir, self.python, self.install_timeout))
        new_wheels = self.recipe.shared_pairs(uploaded)
        if new_wheels:
            store = wheel_store_step("store", self.layout, self.build_dir, self.python, new_wheels)
            steps.insert(min(2, len(steps)), store)
        pending: list[tuple[InstallStep, PendingResult[ExecResult]]] = []
        previous: PendingResult[ExecResult] | None = None
        # The environment store is shared on purpose (other users may use the
        # environment): its marker stays world-readable.
        marker = write_file_op(
            f"{self.build_dir}/{READY}", ready_content(self.recipe, self.token, self.owner),
            mode=0o644,
        )
        with self.agent.batch() as batch:
            for step in steps:
                added = batch.add(_exec(step), requires=[previous] if previous else [])
                pending.append((step, added))
                if step.required:
                    previous = added
            ready = batch.add(marker, requires=[previous] if previous else [])
            publish = batch.add(
                exec_op(publish_argv(self.layout, self.token), timeout=30.0), requires=[ready]
            )
        for step, added in pending:
            self._check(step, added)
        ready.result()
        if publish.result().ok:
            return True
        if self.agent.run(tail_op([TailRequest(self.layout.ready_marker, 0, 1)])).files[0].exists:
            self.log.info("another process published %s first; using it", self.layout.env_dir)
            return False
        raise EnvironmentSetupError(
            f"could not publish {self.layout.env_dir}: {publish.result().stderr.strip()}"
        )

    def _check(self, step: InstallStep, pending: PendingResult[ExecResult]) -> ExecResult:
        try:
            result = pending.result()
        except AgentOpError as exc:
            output = str(exc.details.get("stderr") or exc.details.get("stdout") or exc.message)
            raise EnvironmentSetupError(
                f"{step.label} on the cluster failed ({exc.type}): {output.strip()[-3000:]}"
            ) from None
        if not result.ok:
            output = (result.stdout + result.stderr).strip()[-2000:]
            self.log.warning("%s reported problems: %s", step.label, output)
        return result


def _exec(step: InstallStep) -> AgentOp[ExecResult]:
    return exec_op(
        step.argv, stdin=step.stdin, timeout=step.timeout, env=dict(step.env), check=step.required
    )


def tar_bytes(generated: Sequence[tuple[str, bytes]], files: Sequence[PackFile]) -> bytes:
    """One uncompressed tar of generated and local files (wheels are compressed already)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in generated:
            tar.addfile(_info(name, len(data)), io.BytesIO(data))
        for item in files:
            with open(item.path, "rb") as handle:
                tar.addfile(_info(item.name, os.fstat(handle.fileno()).st_size), handle)
    return buffer.getvalue()


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = int(time.time())
    return info
