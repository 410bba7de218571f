"""Where and how an SSH transport logs in (:class:`SSHTarget`) and its limits
(:class:`SSHOptions`): immutable values, the key of the process-wide connection."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

HostKeyChecking = Literal["strict", "accept-new", "off"]


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to log in. ``password``/``key_path`` None means "not used".

    The key's OpenSSH certificate is the file ``certificate_path`` when set, else
    ``<key_path>-cert.pub``. ``certificate_renew_command`` (an argument list run on this
    machine, None: never run) renews it before a login when it is missing or expires within
    ``certificate_min_validity`` seconds (:mod:`dagster_slurm.transport.certificates`).

    ``host`` is the name or address connected to; ``alias`` is the ``Host`` name the user
    wrote when an SSH config file resolved it to another ``host``
    (:mod:`dagster_slurm.transport.ssh_config`), else None; ``config_file`` is that file
    (so that OpenSSH's own ``ssh`` can be pointed at it), None with no alias.
    """

    host: str
    port: int
    user: str
    key_path: str | None = None
    password: str | None = field(default=None, repr=False)
    known_hosts_path: str | None = None
    host_key_checking: HostKeyChecking = "strict"
    allow_agent: bool = True
    jump: SSHTarget | None = None
    certificate_renew_command: tuple[str, ...] | None = None
    certificate_min_validity: float = 300.0
    certificate_path: str | None = None
    alias: str | None = None
    config_file: str | None = None

    @property
    def address(self) -> str:
        """``user@host:port``, followed by `` (Host alias)`` when the SSH config file
        resolved ``alias`` to ``host``."""
        named = f" (Host {self.alias})" if self.alias else ""
        return f"{self.user}@{self.host}:{self.port}{named}"

    @property
    def label(self) -> str:
        """:attr:`address` (through ``jump`` when set), for messages; no secrets:
        ``alice@10.0.0.5:22 (Host login) via alice@192.0.2.1:22 (Host gw)``."""
        via = f" via {self.jump.label}" if self.jump else ""
        return f"{self.address}{via}"


@dataclass(frozen=True)
class SSHOptions:
    """Timeouts and limits of a transport (seconds unless stated)."""

    connect_timeout: float = 15.0
    command_timeout: float = 300.0
    keepalive_interval: int = 30
    max_channels: int = 8
    reconnect_attempts: int = 3
    reconnect_backoff: float = 1.0
