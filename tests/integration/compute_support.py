"""Shared helpers for the compute integration tests (payload scripts, resources, squeue)."""


import os
import re
import subprocess
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import dagster as dg

from dagster_slurm import SlurmQueueConfig, SlurmResource
from dagster_slurm.agent.ops import exec_op
from dagster_slurm.agent.results import ExecResult
from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.devcluster import NODES, DevCluster
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.environment import EnvironmentConfig, prepare_environment
from dagster_slurm.launchers.ray import RayLauncher

#: The cluster-side packages of the Ray tests' environment.
RAY_PACKAGES = ["dagster-pipes", "ray[default,data]==2.60.0"]

PAYLOAD_OK = """
import sys
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.log.info(f"extras={pipes.extras}")
    print("payload stdout")
    print("payload stderr", file=sys.stderr)
    pipes.report_asset_materialization(metadata={"rows": 42})
"""


def write_payload(directory: Path, name: str, body: str) -> str:
    path = directory / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def slurm_resource(env: dict[str, str], **queue: object) -> SlurmResource:
    queue.setdefault("partition", "cpu")
    queue.setdefault("time_limit", "00:10:00")
    queue.setdefault("mem", "500M")
    queue.setdefault("cpus", 1)
    return SlurmResource.from_env(environ=env, queue=SlurmQueueConfig(**queue))


def compute(env: dict[str, str], mode: str = "slurm", **kwargs: object) -> ComputeResource:
    if mode == "local":
        return ComputeResource(mode="local")
    if os.environ.get("DAGSTER_SLURM_TEST_ENV_PATH"):
        kwargs.setdefault("pre_deployed_env_path", os.environ["DAGSTER_SLURM_TEST_ENV_PATH"])
    else:
        kwargs.setdefault("env_packages", ["dagster-pipes"])
    slurm = kwargs.pop("slurm", None) or slurm_resource(env)
    return ComputeResource(mode="slurm", slurm=slurm, **kwargs)


def ray_compute(env: dict[str, str], launcher: RayLauncher, **queue: object) -> ComputeResource:
    """An asset-scope ComputeResource with ``launcher`` on the dev cluster whose queue is
    ``queue`` (by default 2 CPUs, 2500M, 10 minutes), in the Ray environment:
    ``DAGSTER_SLURM_TEST_RAY_ENV_PATH`` when set (pre-deployed), else :data:`RAY_PACKAGES`."""
    queue.setdefault("mem", "2500M")
    queue.setdefault("cpus", 2)
    queue.setdefault("time_limit", "00:10:00")
    kwargs: dict[str, object] = {}
    if os.environ.get("DAGSTER_SLURM_TEST_RAY_ENV_PATH"):
        kwargs["pre_deployed_env_path"] = os.environ["DAGSTER_SLURM_TEST_RAY_ENV_PATH"]
    else:
        kwargs["env_packages"] = RAY_PACKAGES
    return ComputeResource(
        mode="slurm", slurm=slurm_resource(env, **queue), default_launcher=launcher, **kwargs
    )


def on_a_node(slurm: SlurmResource, argv: Sequence[str], *, timeout: float = 300.0) -> ExecResult:
    """``argv`` run by the cluster user on one compute node of ``slurm``'s partition: ``srun``
    started on the login node through the library's agent, as a payload would run.

    Anything a payload relies on must be checked this way, not on this machine: a dev-cluster
    node has its own /tmp (and the login node too), so a path under this machine's /tmp (a
    clone of the repository there, pytest's ``tmp_path``) does not exist on the nodes."""
    srun = ["srun", "--partition", slurm.queue.partition or "cpu", "--nodes", "1",
            "--ntasks", "1", "--mem", "500M", "--time", "2", "--job-name", "env-probe"]
    return slurm.agent().run(exec_op([*srun, *argv], timeout=timeout))


def python_on_a_node(slurm: SlurmResource, code: str, **environment: object) -> ExecResult:
    """``python -c code`` on a compute node (:func:`on_a_node`) in the payload environment
    that ``environment`` (``pre_deployed_env_path=...`` or ``env_packages=...``, as given to
    ``ComputeResource``) names: prepared with the library's own
    :func:`~dagster_slurm.environment.prepare_environment` (cached by content hash, so the
    resource reuses it) and activated as the job script does, by sourcing its script."""
    handle = prepare_environment(slurm.agent(), slurm.base_path(), EnvironmentConfig(**environment))
    activate = handle.activation_script or "/dev/null"
    return on_a_node(slurm, ["bash", "-c", '. "$1" && exec python -c "$2"', "probe", activate, code])


def materialize_one(payload: str, resource: ComputeResource, *, raise_on_error: bool = True,
                    extra_slurm_opts: dict | None = None, extra_env: dict | None = None,
                    name: str = "payload_asset",
                    instance: dg.DagsterInstance | None = None) -> dg.ExecuteInProcessResult:
    @dg.asset(name=name)
    def _asset(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(
            context=context, payload_path=payload, extras={"answer": 42},
            extra_slurm_opts=extra_slurm_opts, extra_env=extra_env,
        ).get_results()

    instance = instance or dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        [_asset], resources={"compute": resource}, raise_on_error=raise_on_error, instance=instance
    )
    _INSTANCES[result.run_id] = instance
    return result


_INSTANCES: dict[str, dg.DagsterInstance] = {}


def run_logs(result: dg.ExecuteInProcessResult) -> list[str]:
    """Every user-facing log message of the run (context.log and Pipes logs)."""
    instance = _INSTANCES[result.run_id]
    return [entry.user_message for entry in instance.all_logs(result.run_id)]


def metadata_of(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    """The metadata of the run's one asset materialization, as plain values."""
    (event,) = result.get_asset_materialization_events()
    return {key: value.value for key, value in event.materialization.metadata.items()}


def job_id_of(result: dg.ExecuteInProcessResult) -> str:
    """The id of the Slurm job the run's logs say was submitted (the first one)."""
    for message in run_logs(result):
        found = re.search(r"Submitted Slurm job (\d+)", message or "")
        if found:
            return found.group(1)
    raise AssertionError("no job id in the run's logs")


def logged(instance: dg.DagsterInstance, text: str) -> bool:
    """Whether any run of ``instance`` has logged a message containing ``text`` so far."""
    return any(text in (entry.user_message or "")
               for run in instance.get_runs() for entry in instance.all_logs(run.run_id))


def ray_processes_of(job_id: str) -> list[str]:
    """The command lines of the processes of job ``job_id``'s Ray nodes still running on this
    host (every dev-cluster node)."""
    out = subprocess.run(
        ["pgrep", "-af", f"dsray-{job_id}-"], capture_output=True, text=True, check=False
    ).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def ray_temp_dirs_of(job_id: str) -> list[str]:
    """``node:dir`` of each Ray temp dir of job ``job_id`` left on a dev-cluster node (each
    node has its own /tmp)."""
    info = DevCluster().info()
    return [f"{node.name}:{path.name}" for node in NODES
            for path in info.node_tmp(node.name).glob(f"dsray-{job_id}-*")]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2):  # noqa: ANN001, ANN201
    """``predicate()``'s first truthy value, polled every ``interval`` seconds; an
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def squeue_state(env: dict[str, str], job_id: str) -> str:
    """The job's state as squeue prints it (``RUNNING``), empty when it is not listed."""
    return subprocess.run([slurm_command(env, "squeue"), "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                          text=True, env={"SLURM_CONF": env["SLURM_CONF"]}).stdout.strip()


def squeue_names(env: dict[str, str], prefix: str = "dsl-") -> list[str]:
    out = subprocess.run(
        [slurm_command(env, "squeue"), "-h", "-o", "%j|%T"], capture_output=True, text=True, check=True,
        env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"},
    ).stdout
    return [line for line in out.splitlines() if line.startswith(prefix)]


def step_failure(result: dg.ExecuteInProcessResult) -> str:
    """The failed step's error text (class name and message)."""
    events = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert events, "no step failed"
    error = events[0].step_failure_data.error
    text = []
    while error is not None:
        text.append(f"{error.cls_name}: {error.message}")
        error = error.cause
    return "\n".join(text)
