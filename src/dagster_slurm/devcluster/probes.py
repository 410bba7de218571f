"""Readiness probes and small Slurm client calls against the development cluster.

Each probe answers one question quickly (True/False) and never raises for an expected
"not yet": the caller polls it with a deadline. Slurm commands run with the cluster's
``SLURM_CONF`` so that a user's own Slurm configuration is never consulted.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass

from dagster_slurm.devcluster.layout import LOOPBACK, Settings
from dagster_slurm.devcluster.processes import daemon_env, port_open, run, ssh_banner

#: Base node states in which a node accepts work.
READY_BASE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
#: State flags that make a node unusable even when its base state is fine.
UNUSABLE_FLAGS = frozenset(
    {"DRAIN", "NOT_RESPONDING", "FAIL", "INVALID_REG", "POWERED_DOWN", "POWERING_DOWN"}
)
#: Flags after which ``scontrol update state=resume`` can bring a responding node back.
RESUMABLE = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL"})


@dataclass(frozen=True)
class NodeState:
    """A node's Slurm state, e.g. ``IDLE`` or ``IDLE+DRAIN`` split into base and flags.

    ``slurmd_started`` is when the node's slurmd that last registered started (epoch
    seconds, whole seconds), None when unknown.
    """

    name: str
    base: str
    flags: frozenset[str]
    slurmd_started: float | None = None

    @property
    def ready(self) -> bool:
        """True when the node can run jobs now."""
        return self.base in READY_BASE_STATES and not (self.flags & UNUSABLE_FLAGS)

    @property
    def resumable(self) -> bool:
        """True when the node answers but was left down or drained (e.g. by an old state)."""
        states = {self.base, *self.flags}
        return "NOT_RESPONDING" not in self.flags and bool(states & RESUMABLE)


def parse_node_states(text: str) -> dict[str, NodeState]:
    """Parse ``scontrol -o show node`` output into states by node name."""
    states: dict[str, NodeState] = {}
    for line in text.splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        state = re.search(r"\bState=(\S+)", line)
        if name and state:
            base, *flags = state.group(1).split("+")
            started = _parse_time(re.search(r"\bSlurmdStartTime=(\S+)", line))
            states[name.group(1)] = NodeState(name.group(1), base, frozenset(flags), started)
    return states


def _parse_time(match: re.Match[str] | None) -> float | None:
    """Epoch seconds of a Slurm timestamp (local time, ``2026-01-31T12:00:00``)."""
    if match is None:
        return None
    try:
        return time.mktime(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


class ClusterProbes:
    """Readiness checks and client commands bound to one cluster's settings."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.paths = settings.paths
        self.env = daemon_env({"SLURM_CONF": str(self.paths.slurm_conf)})

    def slurm(self, *argv: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (of its Slurm release)."""
        return run(self.settings.slurm_side(argv), self.env, timeout=timeout)

    def munge(self) -> bool:
        """A credential encoded and decoded through the cluster's own munged socket."""
        socket = str(self.paths.munge_socket)
        encoded = run(["munge", "--socket", socket, "--no-input"], self.env, timeout=10)
        if encoded.returncode != 0:
            return False
        decoded = run(
            ["unmunge", "--socket", socket], self.env, input_text=encoded.stdout, timeout=10
        )
        return decoded.returncode == 0

    def mariadb(self) -> bool:
        """``mariadb-admin ping`` over the server's own socket."""
        argv = [
            "mariadb-admin",
            "--no-defaults",
            f"--socket={self.paths.mariadb_socket}",
            "--user=root",
            "--connect-timeout=2",
            "ping",
        ]
        return run(argv, self.env, timeout=10).returncode == 0

    def slurmdbd(self) -> bool:
        """slurmdbd's port accepts connections."""
        return port_open(LOOPBACK, self.settings.port("slurmdbd"))

    def slurmctld(self) -> bool:
        """``scontrol ping`` reports the controller UP."""
        try:
            proc = self.slurm("scontrol", "ping", timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0 and "UP" in proc.stdout

    def node_states(self) -> dict[str, NodeState]:
        """Current state of every node; empty when slurmctld does not answer."""
        try:
            proc = self.slurm("scontrol", "-o", "show", "node", timeout=10)
        except subprocess.TimeoutExpired:
            return {}
        return parse_node_states(proc.stdout) if proc.returncode == 0 else {}

    def sshd(self) -> bool:
        """The login node's sshd answers with an SSH banner."""
        return ssh_banner(self.settings.ssh_host, self.settings.ssh_port).startswith("SSH-")

    def resume(self, node: str) -> None:
        """Return a drained or down node to service."""
        self.slurm("scontrol", "update", f"nodename={node}", "state=resume")

    def job_ids(self) -> list[str]:
        """Ids of all jobs the controller still tracks (pending, running, completing)."""
        proc = self.slurm("squeue", "-h", "-o", "%i")
        return proc.stdout.split() if proc.returncode == 0 else []

    def cancel_all(self) -> list[str]:
        """Cancel every job of the cluster; return the ids that were cancelled."""
        ids = self.job_ids()
        if ids:
            self.slurm("scancel", *ids)
        return ids

    def sinfo_summary(self) -> str:
        """Human-readable partition summary (``sinfo``), or the error text."""
        try:
            proc = self.slurm("sinfo", "-o", "%P %a %l %D %T %N", timeout=10)
        except subprocess.TimeoutExpired:
            return "sinfo: timed out"
        return (proc.stdout if proc.returncode == 0 else proc.stderr).rstrip()
