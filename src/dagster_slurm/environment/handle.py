"""What :func:`~dagster_slurm.environment.deploy.prepare_environment` returns and takes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Timings:
    """Seconds spent per step of one preparation."""

    probe_s: float = 0.0
    pack_s: float = 0.0
    wait_s: float = 0.0
    upload_s: float = 0.0
    install_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class EnvironmentHandle:
    """The environment a payload runs in.

    ``activation_script``: file to source before the payload (None: nothing to source).
    ``env_hash``: content hash of a packed environment. ``uploaded_bytes``: bytes this call
    sent. ``reused``: the environment existed already. ``kind``: ``pre_deployed``,
    ``wheelhouse``, ``pixi`` or ``none``. ``env_dir``: the environment's directory.
    """

    activation_script: str | None
    env_hash: str | None
    uploaded_bytes: int
    reused: bool
    kind: str = "none"
    env_dir: str | None = None
    timings: Timings = field(default_factory=Timings)


@dataclass(frozen=True)
class DeployOptions:
    """Time budgets (seconds) and polling of :func:`prepare_environment`."""

    install_timeout: float = 1800.0
    wait_timeout: float = 3600.0
    poll_interval: float = 2.0
    max_poll_interval: float = 15.0
    #: Slowest upload rate assumed when bounding the upload (bytes per second).
    min_upload_rate: float = 1_000_000.0
    report_every: float = 30.0
    #: Lifetime of the build lease; the builder renews it every quarter of it.
    lease_ttl: float = 120.0
