"""``SlurmRunConfig``: the run configuration of an asset that calls ``compute.run``.

The published dagster-slurm 1.x package taught it as the Dagster config of an asset, set in
the launchpad and handed on with ``compute.run(..., config=config)``::

    @dg.asset
    def report(context: dg.AssetExecutionContext, compute: ComputeResource,
               config: SlurmRunConfig):
        return compute.run(context=context, payload_path="report.py", config=config).get_results()

Its fields keep the published names. What they map to here:

* ``skip_payload_upload=True`` with ``remote_payload_path``: in Slurm mode the script already
  on the cluster runs instead of an uploaded copy of ``payload_path`` (the command
  ``python <remote_payload_path>``, ``bash`` for a ``.sh`` file, as :func:`payload_command`
  writes it); local mode, which uploads nothing, runs ``payload_path`` as given.
* ``force_env_push``, ``environment_name`` and ``extra_files`` have no equivalent: any value
  but the default is refused when the configuration is built, saying what to use instead.

An asset's own configuration may derive from it and add fields (``class
DoclingConfig(SlurmRunConfig): input_glob: str``).
"""

from __future__ import annotations

import posixpath
import shlex

from dagster import Config
from pydantic import Field, model_validator

from dagster_slurm.config_errors import KnownFieldsOnly
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.base import SCRIPT_SUFFIXES


def payload_command(remote_path: str) -> str:
    """The ``payload_path`` command that runs the script ``remote_path`` on the cluster:
    ``bash <path>`` for a ``.sh`` file, else ``python <path>`` (the environment's ``python``),
    quoted so that a path with spaces stays one word."""
    program = "bash" if SCRIPT_SUFFIXES.get(posixpath.splitext(remote_path)[1]) == "bash" else "python"
    return shlex.join([program, remote_path])


class SlurmRunConfig(Config, KnownFieldsOnly):
    """Run configuration of an asset, handed to ``compute.run(..., config=config)`` (the
    published package's names). Only ``skip_payload_upload`` with ``remote_payload_path``
    changes what runs; the other fields accept only their defaults here."""

    force_env_push: bool = Field(
        default=False,
        description=(
            "Published: rebuild and upload the environment even when cached. Only False is "
            "accepted: a packed environment is named by a hash of its content, so a changed "
            "dependency or local package already gives a new one."
        ),
    )
    skip_payload_upload: bool = Field(
        default=False,
        description=(
            "True: in slurm mode run the script already on the cluster at remote_payload_path "
            "(with python, or bash for a .sh file) instead of uploading payload_path; local "
            "mode runs payload_path. Needs remote_payload_path."
        ),
    )
    remote_payload_path: str | None = Field(
        default=None,
        description=(
            "Absolute path on the cluster of the script run with skip_payload_upload=True. "
            "None: not set (then skip_payload_upload must be False)."
        ),
    )
    environment_name: str | None = Field(
        default=None,
        description=(
            "Published: one of the named environments of project_setup_cmd. Only None is "
            "accepted; per asset, give the environment's directory on the cluster as asset "
            "metadata slurm_pre_deployed_env_path."
        ),
    )
    extra_files: list[str] | None = Field(
        default=None,
        description=(
            "Published: local files uploaded beside the payload. Only None or [] is "
            "accepted: only the payload file is uploaded; put other files on the cluster's "
            "shared filesystem and pass their paths through extra_env or extras."
        ),
    )

    @model_validator(mode="after")
    def _check_honoured(self) -> SlurmRunConfig:
        if self.force_env_push:
            raise ConfigurationError(
                "force_env_push", self.force_env_push,
                "cannot be honoured: a packed environment is named by a hash of its content "
                "(a local project installed from a directory is rebuilt when its files "
                "change), so a changed environment is built and uploaded anyway; leave "
                "force_env_push False",
            )
        if self.environment_name is not None:
            raise ConfigurationError(
                "environment_name", self.environment_name,
                "cannot be honoured: no setup command builds named environments here; give "
                "the asset the environment's directory on the cluster as asset metadata "
                "slurm_pre_deployed_env_path (or ComputeResource(pre_deployed_env_path=...)) "
                "and leave environment_name None",
            )
        if self.extra_files:
            raise ConfigurationError(
                "extra_files", self.extra_files,
                "cannot be honoured: only the payload file is uploaded; put these files on "
                "the cluster's shared filesystem (or in the environment) and pass their "
                "paths through extra_env or extras",
            )
        if self.skip_payload_upload and self.remote_payload_path is None:
            raise ConfigurationError(
                "skip_payload_upload", True,
                "needs remote_payload_path, the script's absolute path on the cluster (no "
                "default location is assumed here)",
            )
        if self.remote_payload_path is not None:
            if not self.skip_payload_upload:
                raise ConfigurationError(
                    "remote_payload_path", self.remote_payload_path,
                    "is used only with skip_payload_upload=True; set that too, or leave "
                    "remote_payload_path None to upload payload_path",
                )
            if not self.remote_payload_path.startswith("/"):
                raise ConfigurationError(
                    "remote_payload_path", self.remote_payload_path,
                    "must be an absolute path on the cluster",
                )
        return self

    def payload_for(self, payload_path: str, *, slurm_mode: bool) -> str:
        """The ``payload_path`` ``compute.run`` runs for this configuration: the command
        running ``remote_payload_path`` in slurm mode with ``skip_payload_upload``, else
        ``payload_path`` unchanged."""
        if slurm_mode and self.skip_payload_upload and self.remote_payload_path is not None:
            return payload_command(self.remote_payload_path)
        return payload_path
