"""``SSHConnectionResource``: how to reach the cluster's login node.

The resource holds configuration only. The live connection is process-wide
(:func:`dagster_slurm.transport.choice.transport_for`): every resource instance with the same
settings in one process shares one login, whatever number of assets or threads use it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar, Literal

from dagster import ConfigurableResource
from pydantic import Field, field_validator, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly, PublishedNames, RenamedField
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.resources.published_env import ssh_environment
from dagster_slurm.transport.choice import ChosenTransport, SharedLogin, transport_for
from dagster_slurm.transport.ssh import SSHOptions, SSHTarget
from dagster_slurm.transport.ssh_config import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_PORT,
    HostConfig,
    host_config,
    jump_chain,
    local_user,
)


class SSHConnectionResource(PublishedNames, ConfigurableResource, KnownFieldsOnly):
    """Connection settings for the Slurm login (edge) node.

    Authentication uses ``key_path`` if set, else ``password`` if set, else the keys offered
    by a running ssh-agent. Host keys are checked against ``known_hosts_path``
    (when None: the SSH config file's ``UserKnownHostsFile``, else ``~/.ssh/known_hosts``);
    relaxing that takes an explicit
    ``host_key_checking`` value.

    A key with an OpenSSH certificate (``<key_path>-cert.pub``) has the certificate checked
    before each login; ``certificate_renew_command`` renews it when it is missing or about
    to expire.

    The OpenSSH client configuration ``ssh_config_path`` (``~/.ssh/config``) is read for
    ``host`` as ``ssh`` reads it: its ``HostName``, ``User``, ``Port``, ``IdentityFile``,
    ``CertificateFile``, ``ProxyJump``, ``UserKnownHostsFile`` and ``ServerAliveInterval``
    apply where the resource leaves the field unset (None); a field given a value wins
    (:mod:`dagster_slurm.transport.ssh_config`).

    ``known_hosts_file=`` (the published package's name) is accepted for
    ``known_hosts_path``, with a deprecation warning.
    """

    renamed_fields: ClassVar[tuple[RenamedField, ...]] = (
        RenamedField("known_hosts_file", "known_hosts_path"),
    )

    host: str = Field(
        description=(
            "Login node host name or IP address, or a Host name of the SSH config file "
            "(ssh_config_path) whose HostName is used."
        )
    )
    port: int | None = Field(
        default=None,
        description="SSH port of the login node; None: the SSH config file's Port, else 22.",
    )
    user: str | None = Field(
        default=None,
        description=(
            "User to log in as; jobs are submitted as this user. None: the SSH config file's "
            "User, else the name of the local user running Dagster."
        ),
    )
    key_path: str | None = Field(
        default=None,
        description=(
            "Private key file; None: the SSH config file's first IdentityFile, else a "
            "password or ssh-agent."
        ),
    )
    password: str | None = Field(
        default=None, repr=False, description="Password; None for key or agent auth."
    )
    known_hosts_path: str | None = Field(
        default=None,
        description=(
            "known_hosts file to verify the host key; None: the SSH config file's "
            "UserKnownHostsFile, else ~/.ssh/known_hosts."
        ),
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
        default=None,
        description=(
            "Bastion to tunnel through; None: the SSH config file's ProxyJump, else connect "
            "directly."
        ),
    )
    use_agent: bool = Field(default=True, description="Offer ssh-agent keys when no password is set.")
    connect_timeout: float = Field(default=15.0, description="Seconds to connect and authenticate.")
    command_timeout: float = Field(default=300.0, description="Default seconds per remote command.")
    keepalive_interval: int | None = Field(
        default=None,
        description=(
            "Seconds between SSH keepalives (0: none); None: the SSH config file's "
            "ServerAliveInterval, else 30."
        ),
    )
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
    ssh_config_path: str | None = Field(
        default=DEFAULT_CONFIG_PATH,
        description=(
            "OpenSSH client configuration read for host (~ is expanded; a missing file gives "
            "no settings): HostName, User, Port, IdentityFile, CertificateFile, ProxyJump, "
            "UserKnownHostsFile and ServerAliveInterval apply to fields left unset. None: "
            "no file is read."
        ),
    )

    @field_validator("port")
    @classmethod
    def _check_port(cls, value: int | None) -> int | None:
        if value is not None and not 0 < value < 65536:
            raise ValueError(f"port={value!r}: must be between 1 and 65535")
        return value

    @field_validator("keepalive_interval")
    @classmethod
    def _check_keepalive(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError(f"keepalive_interval={value!r}: must be 0 (none) or more seconds")
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
        ``PASSWORD``, ``KNOWN_HOSTS``, ``HOST_KEY_CHECKING``, ``SHARED_LOGIN``, ``JUMP_HOST``, ``JUMP_PORT``,
        ``JUMP_USER``, ``JUMP_PASSWORD``, ``JUMP_KEY_PATH``.

        A port that is not set is left to the SSH config file (``ssh_config_path``), else 22;
        so are the other settings not given, as for a resource built directly.

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

        def port(name: str) -> int | None:
            raw = get(name)
            if raw is None:
                return None  # the SSH config file's Port, else 22
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
        shared = get("SHARED_LOGIN") or "auto"
        if shared not in ("auto", "required", "off"):
            raise ConfigurationError(stem + "SHARED_LOGIN", shared, "must be auto, required or off")
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
            shared_login=shared,  # type: ignore[arg-type]
        )

    # -- runtime ---------------------------------------------------------------------------
    def _file_settings(self) -> HostConfig:
        """What ``ssh_config_path`` says for ``host`` (nothing when it is None or missing);
        raises :class:`ConfigurationError` naming the file when it cannot be used."""
        return host_config(self.ssh_config_path, self.host)

    def to_target(self) -> SSHTarget:
        """The immutable login description the transport is keyed by.

        A field given a value (not None) wins; a field left unset takes the SSH config
        file's value for ``host``, else its default. ``host`` is replaced by the file's
        ``HostName`` (the name written is kept as the target's ``alias``). The file's
        ``IdentityFile`` is not used with a ``password``, and its ``CertificateFile`` only
        with its own ``IdentityFile`` (``key_path`` keeps ``<key_path>-cert.pub``).
        ``jump_host`` wins over the file's ``ProxyJump``
        (:func:`~dagster_slurm.transport.ssh_config.jump_chain`)."""
        found = self._file_settings()
        from_file = self.key_path is None and self.password is None
        key_path = found.identity_file if from_file else self.key_path
        host = found.hostname or self.host
        target = SSHTarget(
            host=host,
            port=self.port if self.port is not None else found.port or DEFAULT_PORT,
            user=self.user or found.user or local_user(),
            key_path=key_path,
            password=self.password,
            known_hosts_path=self.known_hosts_path or found.known_hosts_file,
            host_key_checking=self.host_key_checking,
            allow_agent=self.use_agent,
            certificate_renew_command=(tuple(self.certificate_renew_command)
                                       if self.certificate_renew_command else None),
            certificate_min_validity=self.certificate_min_validity_seconds,
            certificate_path=found.certificate_file if from_file and key_path else None,
            alias=self.host if host != self.host else None,
            config_file=(os.path.expanduser(self.ssh_config_path)
                         if host != self.host and self.ssh_config_path else None),
        )
        if self.jump_host is not None:
            return replace(target, jump=self.jump_host.to_target())
        return replace(target, jump=jump_chain(self.ssh_config_path, found.proxy_jump or (),
                                               target))

    def to_options(self) -> SSHOptions:
        """Timeouts and limits of the shared transport; ``keepalive_interval`` None takes
        the SSH config file's ``ServerAliveInterval`` for ``host``, else 30."""
        keepalive = self.keepalive_interval
        if keepalive is None:
            keepalive = self._file_settings().server_alive_interval
        return SSHOptions(
            connect_timeout=self.connect_timeout,
            command_timeout=self.command_timeout,
            keepalive_interval=(keepalive if keepalive is not None
                                else SSHOptions.keepalive_interval),
            max_channels=self.max_channels,
            reconnect_attempts=self.reconnect_attempts,
        )

    def get_transport(self) -> ChosenTransport:
        """The process-wide transport for these settings (connects lazily on first use):
        through the machine's shared login when there is one (see ``shared_login``), else
        over this process's own connection."""
        return transport_for(self.to_target(), self.to_options(), self.shared_login)
