"""``prepare_environment``: make the payload's Python environment exist on the cluster.

Steps and round trips:

* ``pre_deployed_env_path``: one round trip checks for ``<path>/activate.sh`` or
  ``<path>/bin/activate``; the handle names the first found.
* packed: probe the cluster's platform (one round trip; none with
  ``auto_detect_platform=False``), pack locally
  (:mod:`~dagster_slurm.environment.packing.packer`, cached), then check
  ``<base>/envs/<hash>/.ready`` (one round trip). When it exists the environment is reused
  and nothing is uploaded. Otherwise this process takes the build lease and builds
  (:mod:`~dagster_slurm.environment.cluster.builder`: three round trips, uploading only the
  files the cluster lacks as one tar stream).

Concurrency: preparers of the same hash on any machine serialise on a lease in
``<hash>.lease.json``, renewed while the build runs, so the lease of a killed builder
expires within ``lease_ttl`` and a waiter takes over. Waiters poll for ``.ready`` and log whom they wait for. Even if a lease
expires while its builder still runs, two builds never share a directory and only one can
publish: the loser removes its own build and uses the winner's.

Per process: a second call with the same agent, base path and configuration returns the
first handle (``reused=True``, ``uploaded_bytes=0``) without any round trip.

Non-guarantees: a builder killed mid-way leaves its ``.builds/<hash>.<token>`` directory
behind (never used; safe to delete); environments are never garbage-collected.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.ops import tail_op
from dagster_slurm.agent.results import TailRequest
from dagster_slurm.backoff import PollBackoff
from dagster_slurm.environment.cluster.builder import RemoteBuild
from dagster_slurm.environment.cluster.lease_store import LeaseFileStore, LeaseKeeper
from dagster_slurm.environment.cluster.platform import local_platform, probe_cluster
from dagster_slurm.environment.cluster.remote import Recipe, RemoteLayout
from dagster_slurm.environment.config import EnvironmentConfig
from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.environment.handle import DeployOptions, EnvironmentHandle, Timings
from dagster_slurm.environment.packing.packer import Packers, pack_environment
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.state import lease

Log = logging.Logger | logging.LoggerAdapter
_log = logging.getLogger("dagster_slurm.environment")
_LEASE = "build"


_CACHE: dict[tuple, EnvironmentHandle] = {}
_CACHE_LOCKS: dict[tuple, threading.Lock] = {}
_CACHE_GUARD = threading.Lock()


def prepare_environment(
    agent: AgentClient,
    base_path: str,
    config: EnvironmentConfig,
    *,
    logger: Log | None = None,
    project_dir: Path | None = None,
    options: DeployOptions | None = None,
    packers: Packers | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> EnvironmentHandle:
    """Make the environment of ``config`` exist under ``base_path`` on the cluster.

    ``agent``: the cluster-side agent's client (``SlurmResource.agent()``); its transport
    uploads and its ``python`` creates venvs. ``base_path``: absolute directory on the
    cluster (``SlurmResource.base_path()``); environments go to ``<base_path>/envs``.
    ``project_dir``: where to look for a pixi manifest (default: the working directory).
    """
    key = (
        os.getpid(),
        agent.transport,
        agent.python,
        base_path,
        config.identity(),
        str(project_dir),
    )
    with _CACHE_GUARD:
        key_lock = _CACHE_LOCKS.setdefault(key, threading.Lock())
    with key_lock:
        cached = _CACHE.get(key)
        if cached is not None:
            return dataclasses.replace(cached, uploaded_bytes=0, reused=True, timings=Timings())
        preparer = _Preparer(
            agent,
            base_path,
            logger or _log,
            options or DeployOptions(),
            packers or Packers(),
            clock,
            sleep,
        )
        handle = preparer.prepare(config, project_dir or Path.cwd())
        _CACHE[key] = handle
        return handle


def clear_process_cache() -> None:
    """Forget the handles of this process (tests; after deleting environments by hand)."""
    with _CACHE_GUARD:
        _CACHE.clear()


class _Preparer:
    def __init__(
        self,
        agent: AgentClient,
        base_path: str,
        log: Log,
        options: DeployOptions,
        packers: Packers,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        if not base_path.startswith("/"):
            raise ConfigurationError(
                "base_path", base_path, "must be an absolute path on the cluster"
            )
        self.agent = agent
        self.base = base_path.rstrip("/")
        self.log = log
        self.options = options
        self.packers = packers
        self.clock = clock
        self.sleep = sleep

    def prepare(self, config: EnvironmentConfig, project_dir: Path) -> EnvironmentHandle:
        start = self.clock()
        if config.pre_deployed_env_path is not None:
            return self._pre_deployed(config.pre_deployed_env_path)
        if config.env_packer == "none":
            return EnvironmentHandle(None, None, 0, False, "none")
        if config.auto_detect_platform:
            platform = probe_cluster(self.agent)
            self.log.info("cluster Python: %s (%s)", platform.describe(), platform.executable)
        else:
            platform = local_platform()
        probed = self.clock()
        recipe = pack_environment(
            config, platform, local_platform(), project_dir, self.packers, self.log
        )
        packed = self.clock()
        self.log.info(
            "packed %s in %.1f s: %s, %.1f MB, hash %s",
            recipe.kind,
            packed - probed,
            recipe.description,
            recipe.size_bytes / 1e6,
            recipe.env_hash[:16],
        )
        python = (
            platform.executable
            if config.auto_detect_platform and platform.executable
            else self.agent.python
        )
        handle = self._deploy(recipe, python)
        timings = dataclasses.replace(
            handle.timings,
            probe_s=probed - start,
            pack_s=packed - probed,
            total_s=self.clock() - start,
        )
        return dataclasses.replace(handle, timings=timings)

    # -- pre-deployed ----------------------------------------------------------------------
    def _pre_deployed(self, path: str) -> EnvironmentHandle:
        candidates = [f"{path}/activate.sh", f"{path}/bin/activate"]
        result = self.agent.run(tail_op([TailRequest(c, 0, 1) for c in candidates]))
        for chunk in result.files:
            if chunk.exists:
                self.log.info("using the pre-deployed environment %s", chunk.path)
                return EnvironmentHandle(chunk.path, None, 0, True, "pre_deployed", path)
        raise ConfigurationError(
            "pre_deployed_env_path",
            path,
            f"no environment there on the cluster: neither {candidates[0]} nor "
            f"{candidates[1]} exists",
        )

    # -- packed ----------------------------------------------------------------------------
    def _deploy(self, recipe: Recipe, python: str) -> EnvironmentHandle:
        layout = RemoteLayout(self.base, recipe.env_hash)
        if self._ready(layout):
            self.log.info("environment %s exists on the cluster; nothing to upload", layout.env_dir)
            return self._handle(recipe, layout, 0, True)
        store = LeaseFileStore(self.agent, layout.lease_document, layout.lease_lock)
        owner = lease.new_owner_id()
        started = self.clock()
        waiting = PollBackoff(initial=self.options.poll_interval, factor=1.5,
                              maximum=max(self.options.poll_interval, self.options.max_poll_interval))
        next_report = started
        while True:
            grant = lease.acquire(store, _LEASE, owner, self.options.lease_ttl)
            if grant.acquired:
                with LeaseKeeper(store, _LEASE, owner, self.options.lease_ttl, self.log):
                    return self._build_once(recipe, layout, python, owner, started)
            waited = self.clock() - started
            if self.clock() >= next_report:
                holder = grant.holder.owner if grant.holder else "another process"
                self.log.info(
                    "waiting for %s, which is building environment %s (waited %.0f s)",
                    holder,
                    layout.env_dir,
                    waited,
                )
                next_report = self.clock() + self.options.report_every
            if waited > self.options.wait_timeout:
                raise EnvironmentSetupError(
                    f"gave up after {waited:.0f} s waiting for another process to build "
                    f"{layout.env_dir} (lease {layout.lease_document})"
                )
            self.sleep(waiting.current)
            waiting.observe(False)
            if self._ready(layout):
                waited = self.clock() - started
                self.log.info(
                    "environment %s is ready after waiting %.0f s", layout.env_dir, waited
                )
                return self._handle(recipe, layout, 0, True, Timings(wait_s=waited))

    def _build_once(
        self, recipe: Recipe, layout: RemoteLayout, python: str, owner: str, started: float
    ) -> EnvironmentHandle:
        build = RemoteBuild(
            self.agent,
            layout,
            recipe,
            python=python,
            owner=owner,
            token=uuid.uuid4().hex[:12],
            install_timeout=self.options.install_timeout,
            log=self.log,
            clock=self.clock,
        )
        wait_s = self.clock() - started
        outcome = build.run(self._upload_budget(recipe))
        if outcome is None:
            return self._handle(recipe, layout, 0, True, Timings(wait_s=wait_s))
        timings = Timings(wait_s=wait_s, upload_s=outcome.upload_s, install_s=outcome.install_s)
        if outcome.published:
            self.log.info("installed environment %s in %.1f s", layout.env_dir, outcome.install_s)
        return self._handle(recipe, layout, outcome.uploaded_bytes, not outcome.published, timings)

    def _upload_budget(self, recipe: Recipe) -> float:
        return 120.0 + recipe.size_bytes / self.options.min_upload_rate

    def _ready(self, layout: RemoteLayout) -> bool:
        return self.agent.run(tail_op([TailRequest(layout.ready_marker, 0, 1)])).files[0].exists

    def _handle(
        self,
        recipe: Recipe,
        layout: RemoteLayout,
        sent: int,
        reused: bool,
        timings: Timings | None = None,
    ) -> EnvironmentHandle:
        return EnvironmentHandle(
            layout.activation_script,
            recipe.env_hash,
            sent,
            reused,
            recipe.kind,
            layout.env_dir,
            timings or Timings(),
        )
