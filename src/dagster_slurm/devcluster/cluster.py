"""Orchestration of the development cluster: ``up``, ``down``, ``status``, ``info``.

``up`` is idempotent: it installs only missing packages, rewrites only changed files,
reuses daemons that still run with an unchanged configuration, restarts those whose
configuration changed and starts the missing ones, each followed by a bounded
readiness wait. ``down`` stops exactly the processes recorded by ``up`` (or, when the
records were lost, the ones named by the daemons' own pid files in the state directory
whose command name still matches).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from dagster_slurm.devcluster import accounts, certs, database, logins, otp, sites, sshd
from dagster_slurm.devcluster import release as releases
from dagster_slurm.devcluster.config import gpu_device_paths, render_all, write_if_changed
from dagster_slurm.devcluster.daemons import (
    DAEMON_COMMS,
    DaemonSpec,
    build_specs,
    daemon_names,
)
from dagster_slurm.devcluster.errors import (
    DaemonStartError,
    DevClusterError,
    NotRootError,
    PortInUseError,
)
from dagster_slurm.devcluster.info import ClusterStatus, DaemonStatus, DevClusterInfo
from dagster_slurm.devcluster.install import (
    REQUIRED_PACKAGES,
    ROOT_BUILD_PACKAGES,
    ensure_packages,
    install_hint,
)
from dagster_slurm.devcluster.layout import (
    LOGIN_NODE,
    LOGIN_SITES,
    NODES,
    OTHER_USER,
    Settings,
    record_settings,
    resolve_settings,
)
from dagster_slurm.devcluster.probes import ClusterProbes
from dagster_slurm.devcluster.processes import (
    PidRecord,
    RecordStore,
    daemon_env,
    is_alive,
    launch,
    port_open,
    record_from_pid_file,
    run,
    stop,
    tail,
    wait_for,
)

Progress = Callable[[str], None]
_GPU_MAJOR = 195  # major number of NVIDIA character devices


class DevCluster:
    """A Slurm cluster of real daemons on this machine, managed as plain processes.

    ``state_dir``, ``ssh_port``, ``user``, ``ssh_listen`` and ``login_sites`` default to
    the environment variables of :mod:`dagster_slurm.devcluster.layout`, then to what the
    last ``up`` recorded, then to ``/tmp/dslurm``, 2222, ``dslurm``, 127.0.0.1 and no
    extra login sites (:mod:`dagster_slurm.devcluster.sites`); ``login_nodes`` likewise
    (default 1; see :mod:`dagster_slurm.devcluster.logins`). ``progress`` receives one
    line per step.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        ssh_port: int | None = None,
        user: str | None = None,
        ssh_listen: str | None = None,
        progress: Progress | None = None,
        login_sites: Iterable[str] | None = None,
        login_nodes: int | None = None,
        slurm_release: str | None = None,
    ) -> None:
        self.settings: Settings = resolve_settings(
            state_dir, ssh_port, user, ssh_listen, login_sites, login_nodes=login_nodes,
            slurm_release=slurm_release,
        )
        self.paths = self.settings.paths
        self.probes = ClusterProbes(self.settings)
        self.store = RecordStore(self.paths.records, self.paths.lock)
        self._progress: Progress = progress or (lambda _line: None)
        self._notes: list[str] = []
        self._plan = sites.SitePlan()

    # -- queries -------------------------------------------------------------------

    def info(self) -> DevClusterInfo:
        """Connection details (pure: does not check that anything runs)."""
        return DevClusterInfo.from_settings(self.settings)

    def status(self) -> ClusterStatus:
        """Which daemons run (the chosen login sites' too, and any other site that still
        runs), plus an sinfo summary when slurmctld runs."""
        records = self.store.load()
        chosen = {sites.SITES[name].daemon for name in self.settings.login_sites}
        chosen.update(logins.chosen_daemons(self.settings))
        optional = {*sites.SITE_COMMS, "sshd", *logins.all_node_daemons()}
        daemons = []
        for name in _all_daemon_names():
            live = self._live_record(name, records)
            if name in optional and name not in chosen and live is None:
                continue
            recorded = records.get(name)
            pid = live.pid if live else (recorded.pid if recorded else None)
            daemons.append(DaemonStatus(name, pid, live is not None))
        ctld = next(d for d in daemons if d.name == "slurmctld")
        summary = self.probes.sinfo_summary() if ctld.alive else ""
        return ClusterStatus(tuple(daemons), summary)

    # -- up ------------------------------------------------------------------------

    def up(self) -> DevClusterInfo:
        """Install, configure and start whatever is missing; return connection details.

        The login sites not chosen are stopped when they run.

        Raises :class:`NotRootError` when not run as root, :class:`InstallError` when
        packages cannot be installed, and :class:`DaemonStartError` (with the tail of the
        daemon's logs) when a daemon does not start or does not become ready.
        """
        require_root()
        started = time.monotonic()
        root = self.settings.slurm_root
        if root is not None and self.settings.login_sites:
            raise DevClusterError(
                f"login sites run only with the machine's own Slurm release, not with "
                f"{self.settings.slurm_release} (choose --login-sites none)"
            )
        with self._step("packages"):
            required = {**REQUIRED_PACKAGES, **(ROOT_BUILD_PACKAGES if root else {})}
            installed = ensure_packages(self._progress, required)
            self._note("installed " + " ".join(installed) if installed else "all present")
        if root is not None:
            with self._step("slurm root"):
                suite = releases.release_suite(self.settings.slurm_release)
                self._note(releases.ensure_root(root, suite, self._progress))
                self._note(f"slurm-wlm {releases.slurm_version(root)}")
        self.paths.root.mkdir(parents=True, exist_ok=True)
        with self.store.locked():
            with self._step("configuration"):
                self._note(self._prepare())
            self._stop_daemons(self._unchosen_logins(), self.store.load())
            specs = build_specs(self.settings, self.probes)
            if self.settings.login_nodes > 1:
                specs = [s for s in specs if s.name != "sshd"] + logins.specs(self.settings)
            for spec in [*specs, *sites.site_specs(self.settings, self._plan)]:
                with self._step(spec.name):
                    self._note(self._ensure(spec))
            with self._step("associations"):
                users = (self.settings.user, OTHER_USER, "root")
                self._note(accounts.ensure_associations(self.probes.slurm, users))
            self._stop_daemons(self._unchosen_sites(), self.store.load())
        self._progress(f"cluster up in {time.monotonic() - started:.2f} s")
        return self.info()

    def _prepare(self) -> str:
        """Directories, keys, database password, config files, fake GPUs, submitter user."""
        paths = self.paths
        node_names = sorted({
            LOGIN_NODE, *sites.site_nodes(), *(n.name for n in NODES),
            *(node.name for node in logins.login_nodes(self.settings)),
        })
        for directory, mode in (
            (paths.root, 0o755),
            (paths.etc, 0o755),
            (paths.run, 0o755),
            (paths.log, 0o755),
            (paths.secrets, 0o700),
            (paths.spool, 0o755),
            (paths.ctld_state, 0o700),
            (paths.devices, 0o755),
            (paths.mariadb_data, 0o700),
            *((paths.spool / n.name, 0o755) for n in NODES),
            (paths.nodes, 0o700),
            *((paths.node_tmp(name).parent, 0o700) for name in node_names),
            *((paths.node_tmp(name), 0o1777) for name in node_names),
        ):
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, mode)
        env = daemon_env()
        if not paths.munge_key.exists():
            _run_checked(["mungekey", "--create", f"--keyfile={paths.munge_key}"], env)
        os.chmod(paths.munge_key, 0o600)
        password = database.ensure_password(paths)
        changed = [
            f.path.name
            for f in [
                *render_all(self.settings, password, logins.host_lines(self.settings)),
                *logins.render_files(self.settings),
            ]
            if write_if_changed(f.path, f.text, f.mode)
        ]
        _ensure_gpu_devices(gpu_device_paths(self.settings))
        sshd.ensure_keys(self.settings, logins.known_host_targets(self.settings))
        entry = sshd.ensure_user(self.settings.user, self.settings.home, self._progress)
        sshd.ensure_user_files(self.settings, entry)
        sshd.ensure_user(OTHER_USER, Path("/home") / OTHER_USER, self._progress)
        sshd.ensure_privsep_dir()
        self._plan, changed_sites = sites.prepare_sites(self.settings)
        changed += changed_sites
        changed += self._write_client_wrappers()
        record_settings(self.settings)
        return "rewrote " + ", ".join(changed) if changed else "unchanged"

    def _write_client_wrappers(self) -> list[str]:
        """With another Slurm release: ``bin/<command>`` runs that release's client command
        from its root (removed again for the machine's own release)."""
        directory = self.paths.client_bin
        root = self.settings.slurm_root
        if root is None:
            if directory.exists():
                shutil.rmtree(directory)
            return []
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o755)
        changed = []
        for command in releases.CLIENT_COMMANDS:
            argv = self.settings.slurm_side((f"/usr/bin/{command}",))
            text = releases.client_script(command, self.settings.slurm_release, root, argv)
            if write_if_changed(directory / command, text, 0o755):
                changed.append(f"bin/{command}")
        return changed[:1] + ([f"and {len(changed) - 1} more"] if len(changed) > 1 else [])

    def _ensure(self, spec: DaemonSpec) -> str:
        """Reuse, restart or start one daemon; return what was done."""
        digest = spec.digest()
        rec = self._live_record(spec.name, self.store.load())
        action = "started"
        if rec is not None:
            if rec.digest == digest and wait_for(spec.ready, min(spec.ready_timeout, 10.0)):
                self.store.put(rec)
                return f"running, pid {rec.pid}"
            action = (
                "restarted (configuration changed)"
                if rec.digest != digest
                else "restarted (not ready)"
            )
            stop(rec)
        self.store.remove(spec.name)
        rec = self._start(spec, digest)
        return f"{action}, pid {rec.pid}"

    def _start(self, spec: DaemonSpec, digest: str) -> PidRecord:
        for address, port in spec.ports:
            if port_open(address, port):
                raise PortInUseError(
                    f"{spec.name}: port {port} on {address} is used by a process this cluster did "
                    "not start; stop it or choose another state directory/port"
                )
        if spec.before_launch is not None:
            spec.before_launch()
        spec.pid_file.unlink(missing_ok=True)
        code = launch(spec.argv, daemon_env(spec.env), self.paths.output_file(spec.name))
        if code != 0:
            raise self._failure(spec, f"launch exited with code {code}")
        found: list[PidRecord] = []

        def pid_written() -> bool:
            rec = record_from_pid_file(spec.name, spec.pid_file, spec.comm, digest)
            if rec is not None:
                found.append(rec)
            return rec is not None

        if not wait_for(pid_written, 15.0):
            raise self._failure(spec, f"no running {spec.comm} found via {spec.pid_file}")
        rec = found[-1]
        self.store.put(rec)
        if not wait_for(lambda: spec.ready() or not is_alive(rec), spec.ready_timeout):
            late = f" ({spec.describe()})" if spec.describe else ""
            raise self._failure(spec, f"not ready after {spec.ready_timeout:.0f} s{late}")
        if not is_alive(rec):
            raise self._failure(spec, "exited right after starting")
        if spec.after_ready is not None:
            spec.after_ready()
        return rec

    def _live_record(self, name: str, records: Mapping[str, PidRecord]) -> PidRecord | None:
        """The running process of daemon ``name``: from its record, else from its pid file.

        A process found only through its pid file (e.g. after the records were lost) gets
        the digest ``adopted``, so ``up`` restarts it with a known configuration.
        """
        rec = records.get(name)
        if rec is not None and is_alive(rec):
            return rec
        pid_file = self.paths.pid_file(name)
        for comm in sites.SITE_COMMS.get(name, (_COMMS.get(name, ""),)):
            found = record_from_pid_file(name, pid_file, comm, digest="adopted")
            if found is not None:
                return found
        return None

    def _failure(self, spec: DaemonSpec, problem: str) -> DaemonStartError:
        parts = []
        for log in spec.logs:
            text = tail(log)
            if text:
                parts.append(f"--- last lines of {log}:\n{text}")
        return DaemonStartError(spec.name, problem, "\n".join(parts))

    # -- down ------------------------------------------------------------------------

    def down(self, purge: bool = False) -> list[str]:
        """Cancel all jobs, stop the daemons ``up`` recorded; return the names stopped.

        With ``purge`` the whole state directory is removed afterwards.
        """
        require_root()
        stopped: list[str] = []
        if self.paths.root.exists():
            with self.store.locked():
                stopped = self._stop_all()
        if purge and self.paths.root.exists():
            with self._step("purge"):
                shutil.rmtree(self.paths.root)
                self._note(f"removed {self.paths.root}")
                if sites.remove_pam_service(self.settings):
                    self._note(f"removed {otp.PAM_DIR / otp.PAM_SERVICE}")
        return stopped

    def _stop_all(self) -> list[str]:
        recorded = self.store.load()
        if self._live_record("slurmctld", recorded) is not None:
            with self._step("jobs"):
                cancelled = self.probes.cancel_all()
                drained = wait_for(lambda: not self.probes.job_ids(), 15.0)
                self._note(
                    f"cancelled {len(cancelled)}" + ("" if drained else ", some still listed")
                )
        return self._stop_daemons(list(reversed(_all_daemon_names())), recorded)

    def _unchosen_logins(self) -> list[str]:
        chosen = logins.chosen_daemons(self.settings)
        return [name for name in ["sshd", *logins.all_node_daemons()] if name not in chosen]

    def _unchosen_sites(self) -> list[str]:
        return [
            site.daemon for name, site in sites.SITES.items()
            if name not in self.settings.login_sites
        ]

    def _stop_daemons(self, names: list[str], recorded: Mapping[str, PidRecord]) -> list[str]:
        """Stop the daemons ``names`` (in that order) that run; return the names stopped."""
        live = {name: self._live_record(name, recorded) for name in names}
        stopped = []
        for name in names:
            rec = live[name]
            if rec is None:
                if name in recorded:
                    self._progress(f"  {name:<14} {0:6.2f} s  was not running")
                    self.store.remove(name)
                continue
            with self._step(name):
                gone = stop(rec, timeout=20.0 if name == "mariadb" else 10.0)
                self._note(f"stopped pid {rec.pid}" if gone else f"pid {rec.pid} did not exit")
            stopped.append(name)
            self.store.remove(name)
        return stopped

    # -- login sites ---------------------------------------------------------------------

    def otp_code(self, at: float | None = None) -> str:
        """The one-time code the ``otp`` login site accepts at ``at`` (default: now); root
        only. Each code logs in once: a second login needs the code of a later step."""
        return otp.current_code(self.paths, at)

    def issue_certificate(
        self,
        key: str | os.PathLike[str] | None = None,
        out: str | os.PathLike[str] | None = None,
        valid_seconds: int | None = 300,
    ) -> certs.IssuedCertificate:
        """A certificate of the cluster's user CA for the submitter (see
        :func:`dagster_slurm.devcluster.certs.issue_certificate`); root only."""
        return certs.issue_certificate(
            self.settings,
            Path(key) if key is not None else None,
            Path(out) if out is not None else None,
            valid_seconds,
        )

    # -- progress ----------------------------------------------------------------------

    @contextmanager
    def _step(self, name: str) -> Iterator[None]:
        self._notes = []
        began = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - began
            note = "; ".join(self._notes) or "failed"
            self._progress(f"  {name:<14} {took:6.2f} s  {note}")

    def _note(self, text: str) -> None:
        self._notes.append(text)


def _all_daemon_names() -> list[str]:
    """Every daemon ``up`` may start, login nodes and sites included, in start order."""
    return [
        *daemon_names(), *logins.all_node_daemons(),
        *(sites.SITES[name].daemon for name in LOGIN_SITES),
    ]


#: Kernel command name of every daemon (``sshd`` for each login node's, ``login-alias``).
_COMMS: dict[str, str] = {
    **DAEMON_COMMS,
    **{name: "sshd" for name in logins.all_node_daemons()},
    logins.ALIAS_DAEMON: logins.ALIAS_DAEMON,
}


def require_root() -> None:
    """Raise :class:`NotRootError` with install instructions unless running as root."""
    if os.geteuid() != 0:
        raise NotRootError(
            "the development cluster must be started and stopped as root (it installs packages, "
            "creates a user and starts daemons). Run it as root, e.g. in a container or VM; "
            f"it needs these Debian packages: {' '.join(REQUIRED_PACKAGES)} "
            f"(install with: {install_hint()})"
        )


def _run_checked(argv: list[str], env: dict[str, str]) -> None:
    proc = run(argv, env)
    if proc.returncode != 0:
        raise DevClusterError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


def _ensure_gpu_devices(devices: list[Path]) -> None:
    """Create character devices (major 195, minor N) that stand in for GPUs N."""
    for minor, path in enumerate(devices):
        try:
            if stat.S_ISCHR(path.lstat().st_mode):
                continue
            path.unlink()
        except FileNotFoundError:
            pass
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(_GPU_MAJOR, minor))
        os.chmod(path, 0o666)
