"""Keywords of the published package's ``compute.run`` (and ``run_hetjob``) call forms.

``ComputeResource.run`` takes ``launcher``, ``extra_env``, ``extras``, ``extra_slurm_opts``
and ``defer_cleanup``. The published dagster-slurm package's ``run`` took further keywords
(and passed others on to its Pipes clients). Here each of them either does what it did
there or fails with a :class:`~dagster_slurm.errors.ConfigurationError` that names what to
use instead, before anything is submitted or started:

* ``slurm_metrics``: supported, selects the published metadata keys to attach
  (:mod:`dagster_slurm.jobs.published_metadata`);
* ``skip_payload_upload`` / ``remote_payload_path``: supported in slurm mode, the payload
  becomes a command that runs the script already on the cluster (local mode runs the local
  file, as the published package did);
* ``config`` (a ``SlurmRunConfig``): its ``force_env_push``, ``skip_payload_upload``,
  ``remote_payload_path``, ``environment_name`` and ``extra_files`` count as if they were
  given as keywords, the keywords taking precedence;
* ``resource_requirements``, ``force_env_push``, ``environment_name``, ``extra_files``,
  ``metrics_collector``, ``poll_timeout``, ``use_session``, ``pack_cmd_override``,
  ``pre_deployed_env_path_override``, ``python_executable``: accepted when they hold the
  value that asks for nothing (None, False, empty), refused otherwise with the replacement.

Any other keyword is a :class:`TypeError`, as Python gives for an unknown keyword, with the
closest known name.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagster_slurm.config_errors import closest_name
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.jobs.published_metadata import ALL_METRICS, SlurmMetric, metric_selection

RUN_PARAMETERS: tuple[str, ...] = (
    "context", "payload_path", "launcher", "extra_env", "extras", "extra_slurm_opts",
    "defer_cleanup",
)
"""The parameters of ``ComputeResource.run`` itself."""

CONFIG_FIELDS: tuple[str, ...] = (
    "force_env_push", "skip_payload_upload", "remote_payload_path", "environment_name",
    "extra_files",
)
"""The fields of the published ``SlurmRunConfig`` that stand for ``run`` keywords."""

_ENVIRONMENT = "see the ComputeResource fields pre_deployed_env_path and env_packages"

#: Published keywords that are refused unless they ask for nothing, with the replacement.
REFUSED_KEYWORDS: Mapping[str, str] = {
    "resource_requirements": (
        "there is no cluster reuse by matching requirements here: with "
        "allocation_scope='run' every step of a run shares one allocation (and one Ray "
        "cluster with a RayLauncher), shaped by run_allocation=SlurmRunAllocationConfig(...); "
        "a step's own shape goes in extra_slurm_opts"
    ),
    "force_env_push": (
        "environments are deployed under a hash of their content, so a changed environment "
        "is deployed again without being forced; to rebuild one whose content did not "
        "change, remove its directory <base>/envs/<hash> on the cluster"
    ),
    "environment_name": (
        "named environments of a project setup command do not exist here; "
        + _ENVIRONMENT + " (one ComputeResource per environment)"
    ),
    "extra_files": (
        "files beside the payload are not uploaded; put them on the cluster's shared "
        "filesystem and pass their paths (extra_env or extras), or install them with the "
        "environment (env_packages)"
    ),
    "metrics_collector": (
        "there are no metric callbacks; the job's accounting figures are attached as "
        "metadata (dagster_slurm/*, and the published names with "
        "ComputeResource(published_metadata_keys=True)); report further figures from the "
        "payload (Dagster Pipes report_asset_materialization(metadata=...))"
    ),
    "poll_timeout": (
        "the wait ends when the job ends, and Slurm ends the job at its time limit: set "
        "time_limit (extra_slurm_opts={'time_limit': '01:00:00'}, or the queue's time_limit)"
    ),
    "use_session": (
        "a run's steps share one allocation with ComputeResource(mode='slurm', "
        "allocation_scope='run')"
    ),
    "pack_cmd_override": "environments are not packed by a command; " + _ENVIRONMENT,
    "pre_deployed_env_path_override": (
        "the environment is the resource's: use a ComputeResource with "
        "pre_deployed_env_path=... for the assets that need another one"
    ),
    "python_executable": (
        "a .py payload runs with the python of the environment (in local mode the "
        "interpreter that runs Dagster); to use another one, give a command: "
        "payload_path='/path/to/python script.py'"
    ),
}

PUBLISHED_KEYWORDS: tuple[str, ...] = (
    "config", "slurm_metrics", "skip_payload_upload", "remote_payload_path",
    *REFUSED_KEYWORDS,
)
"""Every keyword of the published call form that ``run`` accepts besides its parameters."""


@dataclass(frozen=True)
class PublishedRun:
    """What the published keywords of one call amount to.

    ``payload_path``: the payload to run (a command running the script on the cluster
    when its upload was skipped; else as given). ``published_metrics``: the figures to
    attach under published metadata keys (None: none).
    """

    payload_path: str
    published_metrics: frozenset[SlurmMetric] | None


def _asks_for_nothing(value: object) -> bool:
    return value is None or value is False or (
        isinstance(value, Mapping | list | tuple | set | frozenset) and not value)


def _with_config(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` with the fields of a published ``SlurmRunConfig`` given as ``config``
    added where the keyword itself is not given (or None)."""
    given = dict(arguments)
    config = given.pop("config", None)
    if config is None:
        return given
    if not all(hasattr(config, name) for name in CONFIG_FIELDS):
        raise ConfigurationError(
            "config", config,
            "must be a SlurmRunConfig (an object with the fields "
            + ", ".join(CONFIG_FIELDS) + ") or None",
        )
    for name in CONFIG_FIELDS:
        if given.get(name) is None:
            given[name] = getattr(config, name)
    return given


def _remote_payload(payload_path: str, remote: object, pre_deployed_env_path: str | None) -> str:
    """The command that runs a payload already on the cluster: ``remote`` when given,
    else ``<pre_deployed_env_path>/scripts/<payload's base name>``."""
    if remote is None:
        if pre_deployed_env_path is None:
            raise ConfigurationError(
                "skip_payload_upload", True,
                "needs remote_payload_path (the script's path on the cluster), or "
                "pre_deployed_env_path on the ComputeResource (the script is then "
                "<pre_deployed_env_path>/scripts/<name>); or give payload_path as a command "
                "such as 'python /path/on/cluster/script.py'",
            )
        remote = posixpath.join(pre_deployed_env_path, "scripts", posixpath.basename(payload_path))
    if not isinstance(remote, str) or not remote.startswith("/"):
        raise ConfigurationError("remote_payload_path", remote,
                                 "must be an absolute path on the cluster")
    program = "bash" if remote.endswith(".sh") else "python"
    return f"{program} {shlex.quote(remote)}"


def published_run(
    arguments: Mapping[str, Any],
    *,
    mode: str,
    payload_path: str,
    pre_deployed_env_path: str | None,
    published_metadata_keys: bool,
) -> PublishedRun:
    """Check the published keywords ``arguments`` of one ``run`` call (see the module
    docstring) and say what they amount to; ``mode``, ``pre_deployed_env_path`` and
    ``published_metadata_keys`` are the resource's. Raises :class:`TypeError` for an
    unknown keyword, :class:`ConfigurationError` for a keyword whose value has no
    equivalent here."""
    unknown = sorted(name for name in arguments if name not in PUBLISHED_KEYWORDS)
    if unknown:
        suggestion = closest_name(unknown[0], (*RUN_PARAMETERS, *PUBLISHED_KEYWORDS))
        hint = f"; did you mean {suggestion!r}?" if suggestion else ""
        raise TypeError(f"ComputeResource.run() got an unexpected keyword argument "
                        f"{unknown[0]!r}{hint}")
    given = _with_config(arguments)
    for name, advice in REFUSED_KEYWORDS.items():
        if name in given and not _asks_for_nothing(given[name]):
            raise ConfigurationError(name, given[name], "not supported here: " + advice)
    skip, remote = given.get("skip_payload_upload"), given.get("remote_payload_path")
    if remote is not None and not skip:
        raise ConfigurationError(
            "remote_payload_path", remote,
            "is used only with skip_payload_upload=True (the payload is then not uploaded)",
        )
    if skip and mode == "slurm":
        payload_path = _remote_payload(payload_path, remote, pre_deployed_env_path)
    selection = given.get("slurm_metrics")
    if selection is not None:
        metrics: frozenset[SlurmMetric] | None = metric_selection(selection)
    else:
        metrics = ALL_METRICS if published_metadata_keys else None
    return PublishedRun(payload_path, metrics)


def refuse_published_hetjob(components: object, arguments: Mapping[str, Any]) -> None:
    """Raise a :class:`ConfigurationError` for the published ``run_hetjob(context,
    assets=[(key, payload_path, resources), ...], launchers={...})`` form: ``assets`` or
    ``launchers`` given, or ``components`` a list of such triples. Returns for today's
    form; any other keyword is a :class:`TypeError`."""
    unknown = sorted(name for name in arguments if name not in ("assets", "launchers"))
    if unknown:
        raise TypeError(f"ComputeResource.run_hetjob() got an unexpected keyword argument "
                        f"{unknown[0]!r}")
    triples = isinstance(components, list | tuple) and bool(components) and all(
        isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], str)
        for item in components)
    if not arguments and not triples:
        return
    shown = arguments.get("assets", components if triples else None)
    raise ConfigurationError(
        "assets", shown,
        "run_hetjob(context, assets=[(asset_key, payload_path, resources), ...], "
        "launchers={...}) is the published package's form, which ran one payload per "
        "component without Dagster Pipes. Here one payload runs on component 0 and starts "
        "work on component n with 'srun --het-group=<n>': run_hetjob(context, "
        "components=[HetJobComponent(nodes=..., cpus_per_task=..., mem=..., "
        "gpus_per_node=..., partition=...), ...], payload_path='driver.py', "
        "launcher=...); see docs/hetjobs.md. Assets that need different shapes can also "
        "each call compute.run(..., extra_slurm_opts={...})",
    )
