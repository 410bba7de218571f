"""What the user sets about the payload's Python environment on the cluster.

:class:`EnvironmentConfig` is a Dagster :class:`~dagster.Config`: nest it in a resource, or
copy its fields (the validators are module functions, reusable by another model).

Choices, in order:

1. ``pre_deployed_env_path``: a directory on the cluster holding ``activate.sh`` or a venv
   (``bin/activate``), sourced before the payload. Nothing is packed or uploaded.
2. ``env_packer="none"``: the payload runs with whatever the job's shell provides.
3. Otherwise a packed environment: with ``env_packer="auto"``, pixi-pack when ``pixi`` and
   ``pixi-pack`` are installed here and the project has a pixi manifest, else a wheelhouse
   of ``env_packages`` (None: the current environment's distributions) installed into a
   venv on the login node without internet access. ``auto_detect_platform`` asks the
   cluster's Python for its platform first; turned off, the cluster is assumed to match
   this machine (one round trip less, wrong wheels if it does not).

Caching: wheels are kept in ``env_cache_dir`` per cluster platform. A requirement list is
resolved once per platform and then reused as resolved: pin versions (``numpy==2.1.0``) or
clear the cache to pick up newer releases of unpinned entries.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from dagster import Config
from packaging.requirements import InvalidRequirement, Requirement
from pydantic import Field, field_validator, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly
from dagster_slurm.errors import ConfigurationError

Packer = Literal["auto", "pixi", "wheelhouse", "none"]


def validate_remote_dir(field: str, value: str | None) -> str | None:
    """An absolute directory on the cluster (no ``~``, no newline), without trailing ``/``."""
    if value is None:
        return None
    if not value.startswith("/"):
        raise ConfigurationError(field, value, "must be an absolute path on the cluster (no '~')")
    if "\n" in value or "\0" in value:
        raise ConfigurationError(field, value, "must not contain a newline or NUL")
    return value.rstrip("/") or "/"


def validate_env_packages(value: list[str] | None) -> list[str] | None:
    """Each entry must be a PEP 508 requirement string (``numpy==2.1.0``, ``dagster-pipes``)."""
    if value is None:
        return None
    for entry in value:
        try:
            Requirement(entry)
        except InvalidRequirement as exc:
            raise ConfigurationError(
                "env_packages", entry, f"not a requirement string: {exc}"
            ) from None
    return list(value)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dagster-slurm`` (``~/.cache/dagster-slurm``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dagster-slurm"


class EnvironmentConfig(Config, KnownFieldsOnly):
    """The Python environment a payload runs in on the cluster (see the module docstring)."""

    pre_deployed_env_path: str | None = Field(
        default=None,
        description=(
            "Absolute directory on the cluster holding activate.sh or a venv (bin/activate), "
            "sourced before the payload. Set it for an environment that already exists there; "
            "nothing is packed or uploaded."
        ),
    )
    auto_detect_platform: bool = Field(
        default=True,
        description=(
            "Ask the cluster's Python for its version, ABI, architecture and libc and pack "
            "for that platform. False: assume the cluster matches this machine."
        ),
    )
    env_packages: list[str] | None = Field(
        default=None,
        description=(
            "None: pack the current environment's distributions (pinned; build and test "
            "tools left out). A list: only these requirement strings and their dependencies, "
            "e.g. ['dagster-pipes', 'numpy==2.1.0']; dagster-pipes is added when missing."
        ),
    )
    env_cache_dir: str | None = Field(
        default=None,
        description="Local cache of wheels and packs; None: ~/.cache/dagster-slurm.",
    )
    env_packer: Packer = Field(
        default="auto",
        description=(
            "'auto': pixi-pack when pixi is installed here and the project has a pixi "
            "manifest, else a wheelhouse; 'pixi' or 'wheelhouse' to force one; 'none' to "
            "use the job's shell environment as it is."
        ),
    )

    @field_validator("pre_deployed_env_path")
    @classmethod
    def _check_path(cls, value: str | None) -> str | None:
        return validate_remote_dir("pre_deployed_env_path", value)

    @field_validator("env_packages")
    @classmethod
    def _check_packages(cls, value: list[str] | None) -> list[str] | None:
        return validate_env_packages(value)

    @model_validator(mode="after")
    def _check_combination(self) -> EnvironmentConfig:
        if self.pre_deployed_env_path is not None and self.env_packages is not None:
            raise ConfigurationError(
                "env_packages",
                self.env_packages,
                "cannot be combined with pre_deployed_env_path (nothing is packed then)",
            )
        if self.env_packer in ("none", "pixi") and self.env_packages is not None:
            raise ConfigurationError(
                "env_packages",
                self.env_packages,
                f"is only used by the wheelhouse packer, not env_packer={self.env_packer!r}",
            )
        return self

    def cache_dir(self) -> Path:
        """The local cache directory (``env_cache_dir`` with ``~`` expanded, or the default)."""
        if self.env_cache_dir:
            return Path(os.path.expanduser(self.env_cache_dir))
        return default_cache_dir()

    def identity(self) -> str:
        """A string equal for equal configurations (per-process cache key)."""
        return self.model_dump_json()
