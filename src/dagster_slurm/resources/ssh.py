"""``SSHConnectionResource``: how to reach the cluster's login node.

The resource holds configuration only. The live connection is process-wide
(:func:`dagster_slurm.transport.ssh.shared_transport`): every resource instance with the same
settings in one process shares one login, whatever number of assets or threads use it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar, Literal

from dagster import ConfigurableResource
from pydantic import Field, field_validator, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly, PublishedNames, RenamedField
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.resources.published_env import ssh_environment
from dagster_slurm.transport.choice import ChosenTransport, SharedLogin, transport_for
from dagster_slurm.transport.ssh import SSHOptions, SSHTarget


class SSHConnectionResource(PublishedNames, ConfigurableResource, KnownFieldsOnly):
    """Connection settings for the Slurm login (edge) node.

    Authentication uses ``key_path`` if set, else ``password`` if set, else the keys offered
    by a running ssh-agent. Host keys are checked against ``known_hosts_path``
    (``~/.ssh/known_hosts`` when None); relaxing that takes an explicit
    ``host_key_checking`` value.

    A key with an OpenSSH certificate (``<key_path>-cert.pub``) has the certificate checked
    before each login; ``certificate_renew_command`` renews it when it is missing or about
    to expire.

    ``known_hosts_file=`` (the published package's name) is accepted for
    ``known_hosts_path``, with a deprecation warning.
    """

    renamed_fields: ClassVar[tuple[RenamedField, ...]] = (
        RenamedField("known_hosts_file", "known_hosts_path"),
    )

    host: str = Field(description="Login node host name or IP address.")
    port: int = Field(default=22, description="SSH port of the login node.")
    user: str = Field(description="User to log in as; jobs are submitted as this user.")
    key_path: str | None = Field(
        default=None, description="Private key file; None to use a password or ssh-agent."
    )
    password: str | None = Field(
        default=None, repr=False, description="Password; None for key or agent auth."
    )
    known_hosts_path: str | None = Field(
        default=None, description="known_hosts file to verify the host key; None: ~/.ssh/known_hosts."
    )
    host_key_checking: Literal["strict", "accept-new", "off"] = Field(
        default="strict",
        description=(
            "'strict': the host must be in known_hosts with a matching key. 'accept-new': an "
            "unknown host is trusted on first use (a changed key is still refused). 'off': no "
            "verification (logged as a warning)."
        ),
    )
    jump_host: SSHConnectionResource | None = Field(
        default=None, description="Bastion to tunnel through (ProxyJump); None to connect directly."
    )
    use_agent: bool = Field(default=True, description="Offer ssh-agent keys when no password is set.")
    connect_timeout: float = Field(default=15.0, description="Seconds to connect and authenticate.")
    command_timeout: float = Field(default=300.0, description="Default seconds per remote command.")
    keepalive_interval: int = Field(default=30, description="Seconds between SSH keepalives.")
    max_channels: int = Field(
        default=8,
        description=(
            "Concurrent commands on the one shared connection; keep below the server's "
            "MaxSessions (10 by default). Further calls wait for a free channel."
        ),
    )
    reconnect_attempts: int = Field(
        default=3, description="Logins tried when the connection drops, before a call fails."
    )
    certificate_renew_command: list[str] | None = Field(
        default=None,
        description=(
            "Command (an argument list, run on this machine without a shell, with no terminal "
            "and no input, for at most 120 s) that writes a fresh OpenSSH certificate to "
            "'<key_path>-cert.pub'. It runs before a login when that file is missing or "
            "expires within certificate_min_validity_seconds. Needs key_path. None: no "
            "renewal; a certificate found next to the key is still checked, and an expired "
            "one fails the login before connecting."
        ),
    )
    shared_login: SharedLogin = Field(
        default="auto",
        description=(
            "'auto': use the shared login of this machine (dagster-slurm login) to the same "
            "host, port and user whenever it is up, else log in with this process's own "
            "connection (which never prompts: a site that wants a one-time code fails at "
            "once naming the command to run). 'required': only the shared login; without "
            "it every command fails at once. 'off': never the shared login."
        ),
    )
    certificate_min_validity_seconds: float = Field(
        default=300.0,
        description=(
            "Seconds of validity the certificate must have left at a login; with less, "
            "certificate_renew_command runs first. Not used without that command."
        ),
    )

    @field_validator("port")
    @classmethod
    def _check_port(cls, value: int) -> int:
        if not 0 < value < 65536:
            raise ValueError(f"port={value!r}: must be between 1 and 65535")
        return value

    @field_validator("max_channels", "reconnect_attempts")
    @classmethod
    def _check_positive(cls, value: int, info) -> int:  # noqa: ANN001 - pydantic's info type
        if value < 1:
            raise ValueError(f"{info.field_name}={value!r}: must be at least 1")
        return value

    @field_validator("certificate_renew_command")
    @classmethod
    def _check_renew_command(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value or not all(isinstance(part, str) and part for part in value):
            raise ConfigurationError(
                "certificate_renew_command", value,
                "must be a non-empty list of non-empty strings (the program and its "
                "arguments, run without a shell), or None for no renewal",
            )
        return value

    @field_validator("certificate_min_validity_seconds")
    @classmethod
    def _check_min_validity(cls, value: float) -> float:
        if not value >= 0:
            raise ConfigurationError("certificate_min_validity_seconds", value,
                                     "must be zero or more seconds")
        return value

    @model_validator(mode="after")
    def _check_auth(self) -> SSHConnectionResource:
        if self.key_path and self.password:
            raise ValueError("key_path and password are mutually exclusive: set one of them")
        if not self.host.strip():
            raise ValueError("host='': the login node's host name is required")
        if self.certificate_renew_command is not None and not self.key_path:
            raise ConfigurationError(
                "certificate_renew_command", self.certificate_renew_command,
                "needs key_path: the certificate it renews is '<key_path>-cert.pub'",
            )
        return self

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_env(
        cls, prefix: str = "SLURM_EDGE_NODE_", environ: Mapping[str, str] | None = None
    ) -> SSHConnectionResource:
        """Build from ``<prefix>HOST``, ``PORT``, ``USER``, ``KEY_PATH`` (or ``KEY``),
        ``PASSWORD``, ``KNOWN_HOSTS``, ``HOST_KEY_CHECKING``, ``JUMP_HOST``, ``JUMP_PORT``,
        ``JUMP_USER``, ``JUMP_PASSWORD``, ``JUMP_KEY_PATH``.

        ``prefix`` may be given with or without its trailing underscore. A missing ``HOST`` or
        ``USER`` or a non-numeric ``PORT`` raises :class:`ConfigurationError` naming the
        variable. The published package's names are read too, with a deprecation warning:
        ``SLURM_SSH_*`` when the default prefix finds no host, ``KNOWN_HOSTS_FILE`` and
        ``JUMP_KEY`` (see :mod:`dagster_slurm.resources.published_env`).
        """
        env = os.environ if environ is None else environ
        stem = prefix if prefix.endswith("_") or not prefix else prefix + "_"
        env, stem = ssh_environment(env, stem)

        def get(name: str) -> str | None:
            value = env.get(stem + name)
            return value if value else None

        def required(name: str) -> str:
            value = get(name)
            if value is None:
                raise ConfigurationError(stem + name, None, "environment variable is not set")
            return value

        def port(name: str) -> int:
            raw = get(name)
            if raw is None:
                return 22
            if not raw.isdigit():
                raise ConfigurationError(stem + name, raw, "must be a port number")
            return int(raw)

        jump = None
        if get("JUMP_HOST"):
            jump = cls(
                host=required("JUMP_HOST"),
                port=port("JUMP_PORT"),
                user=get("JUMP_USER") or required("USER"),
                password=get("JUMP_PASSWORD"),
                key_path=get("JUMP_KEY_PATH"),
                known_hosts_path=get("KNOWN_HOSTS"),
            )
        checking = get("HOST_KEY_CHECKING") or "strict"
        if checking not in ("strict", "accept-new", "off"):
            raise ConfigurationError(
                stem + "HOST_KEY_CHECKING", checking, "must be strict, accept-new or off"
            )
        return cls(
            host=required("HOST"),
            port=port("PORT"),
            user=required("USER"),
            key_path=get("KEY_PATH") or get("KEY"),
            password=get("PASSWORD"),
            known_hosts_path=get("KNOWN_HOSTS"),
            host_key_checking=checking,  # type: ignore[arg-type]
            jump_host=jump,
        )

    # -- runtime ---------------------------------------------------------------------------
    def to_target(self) -> SSHTarget:
        """The immutable login description the transport is keyed by."""
        return SSHTarget(
            host=self.host,
            port=self.port,
            user=self.user,
            key_path=self.key_path,
            password=self.password,
            known_hosts_path=self.known_hosts_path,
            host_key_checking=self.host_key_checking,
            allow_agent=self.use_agent,
            jump=self.jump_host.to_target() if self.jump_host else None,
            certificate_renew_command=(tuple(self.certificate_renew_command)
                                       if self.certificate_renew_command else None),
            certificate_min_validity=self.certificate_min_validity_seconds,
        )

    def to_options(self) -> SSHOptions:
        """Timeouts and limits of the shared transport."""
        return SSHOptions(
            connect_timeout=self.connect_timeout,
            command_timeout=self.command_timeout,
            keepalive_interval=self.keepalive_interval,
            max_channels=self.max_channels,
            reconnect_attempts=self.reconnect_attempts,
        )

    def get_transport(self) -> ChosenTransport:
        """The process-wide transport for these settings (connects lazily on first use):
        through the machine's shared login when there is one (see ``shared_login``), else
        over this process's own connection."""
        return transport_for(self.to_target(), self.to_options(), self.shared_login)
