"""Jobs and helpers for the run-scope tests that step subprocesses (and scripts) import.

The multiprocess executor rebuilds the job in each step process from this module, so the
job is configured through environment variables: ``DSLURM_TEST_SESSION`` (``ray`` or
``bash``), ``DSLURM_TEST_PAYLOAD`` (the payload file), ``DSLURM_TEST_HEARTBEAT_TIMEOUT``,
``MEET_STEPS`` (comma-separated assets whose payloads wait for each other in ``MEET_DIR``, a
directory every node sees).
"""

import os
import subprocess
import threading

import dagster as dg
from compute_support import RAY_PACKAGES, slurm_resource

from dagster_slurm import ComputeResource, RayLauncher, SlurmRunAllocationConfig
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.launchers.bash import BashLauncher

RAY_SESSION_PAYLOAD = """
import os, time
import ray
from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    started = time.time()
    ray.init(address="auto", logging_level="ERROR")

    @ray.remote
    def square(x):
        return x * x

    total = sum(ray.get([square.remote(i) for i in range(4)]))
    if os.environ.get("MEET_AS"):
        # the steps named in MEET_STEPS wait here for each other (a minute at most): their
        # windows overlap when they ran at the same time
        os.makedirs(os.environ["MEET_DIR"], exist_ok=True)
        open(os.path.join(os.environ["MEET_DIR"], os.environ["MEET_AS"]), "w").close()
        deadline = time.time() + 60
        while time.time() < deadline and not all(
                os.path.exists(os.path.join(os.environ["MEET_DIR"], name))
                for name in os.environ["MEET_STEPS"].split(",")):
            time.sleep(0.1)
    pipes.report_asset_materialization(metadata={
        "gcs_address": ray.get_runtime_context().gcs_address,
        "ray_address": os.environ["RAY_ADDRESS"],
        "slurm_job_id": os.environ["SLURM_JOB_ID"],
        "slurm_step_id": os.environ.get("SLURM_STEP_ID", ""),
        "window": [started, time.time()],
        "total": total,
    })
"""


def session_compute(kind: str | None = None, env: dict[str, str] | None = None,
                    resource_options: dict[str, object] | None = None,
                    **allocation: object) -> ComputeResource:
    """A run-scoped compute resource on the dev cluster (settings from ``env`` over the
    process environment); ``resource_options`` are more fields of the resource itself
    (None: none), ``allocation`` fields of its run allocation."""
    env = {**os.environ, **(env or {})}
    kind = kind or env.get("DSLURM_TEST_SESSION", "bash")
    timeout = env.get("DSLURM_TEST_HEARTBEAT_TIMEOUT")
    allocation.setdefault("heartbeat_interval", float(env.get("DSLURM_TEST_HEARTBEAT_INTERVAL", "2")))
    allocation.setdefault("heartbeat_timeout", float(timeout) if timeout else 600.0)
    # the dev cluster's session directory is on one host's filesystem: no attribute caching
    allocation.setdefault("allow_short_heartbeat_timeout", True)
    kwargs: dict[str, object] = dict(resource_options or {})
    if kind == "ray":
        launcher: object = RayLauncher(include_dashboard=False)
        allocation.setdefault("mem", "2500M")
        allocation.setdefault("cpus_per_task", 2)
        if env.get("DAGSTER_SLURM_TEST_RAY_ENV_PATH"):
            kwargs["pre_deployed_env_path"] = env["DAGSTER_SLURM_TEST_RAY_ENV_PATH"]
        else:
            kwargs["env_packages"] = RAY_PACKAGES
    else:
        launcher = BashLauncher()
        if env.get("DAGSTER_SLURM_TEST_ENV_PATH"):
            kwargs["pre_deployed_env_path"] = env["DAGSTER_SLURM_TEST_ENV_PATH"]
        else:
            kwargs["env_packages"] = ["dagster-pipes"]
    return ComputeResource(
        mode="slurm", slurm=slurm_resource(env), default_launcher=launcher,
        allocation_scope="run", run_allocation=SlurmRunAllocationConfig(**allocation), **kwargs,
    )


def _payload_asset(name: str, deps: list[str]) -> dg.AssetsDefinition:
    @dg.asset(name=name, deps=deps)
    def _asset(context: dg.AssetExecutionContext, compute: ComputeResource):
        meet = os.environ.get("MEET_STEPS", "")
        extra = ({"MEET_DIR": os.environ["MEET_DIR"], "MEET_AS": name, "MEET_STEPS": meet}
                 if name in meet.split(",") else {})
        yield from compute.run(
            context=context, payload_path=os.environ["DSLURM_TEST_PAYLOAD"], extra_env=extra,
        ).get_results()

    return _asset


def diamond_assets() -> list[dg.AssetsDefinition]:
    """first -> (left, right) -> last: left and right can run at the same time."""
    return [
        _payload_asset("first", []),
        _payload_asset("left", ["first"]),
        _payload_asset("right", ["first"]),
        _payload_asset("last", ["left", "right"]),
    ]


def diamond_job() -> dg.JobDefinition:
    """The diamond under the multiprocess executor (2 steps at a time)."""
    defs = dg.Definitions(
        assets=diamond_assets(),
        resources={"compute": session_compute()},
        jobs=[dg.define_asset_job(
            "diamond", executor_def=dg.multiprocess_executor.configured({"max_concurrent": 2}),
        )],
    )
    return defs.resolve_job_def("diamond")


FLAKY_PAYLOAD = """
import os, sys
from dagster_pipes import open_dagster_pipes
marker = os.environ["FLAKY_MARKER"]
with open_dagster_pipes() as pipes:
    if not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit(7)
    pipes.report_asset_materialization(metadata={"slurm_job_id": os.environ["SLURM_JOB_ID"]})
"""


def retry_job() -> dg.JobDefinition:
    """One asset that fails on its first attempt and is retried in a new process."""

    @dg.asset(retry_policy=dg.RetryPolicy(max_retries=1))
    def flaky(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(
            context=context, payload_path=os.environ["DSLURM_TEST_PAYLOAD"],
            extra_env={"FLAKY_MARKER": os.environ["FLAKY_MARKER"]},
        ).get_results()

    defs = dg.Definitions(
        assets=[flaky],
        resources={"compute": session_compute()},
        jobs=[dg.define_asset_job("retry", executor_def=dg.multiprocess_executor)],
    )
    return defs.resolve_job_def("retry")


def active_jobs(env: dict[str, str], prefix: str) -> list[tuple[str, str, str]]:
    """(job id, name, state) of the queue's pending or running jobs whose name starts with prefix."""
    out = subprocess.run(
        [slurm_command(env, "squeue"), "-h", "-o", "%i|%j|%T"], capture_output=True, text=True, check=True,
        env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"},
    ).stdout
    rows = [tuple(line.split("|")) for line in out.splitlines() if line.strip()]
    return [r for r in rows if r[1].startswith(prefix)
            and r[2] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")]


def accounted_jobs(env: dict[str, str], prefix: str) -> list[str]:
    """Job ids sacct knows (allocations only, last hour) whose name starts with prefix."""
    out = subprocess.run(
        [slurm_command(env, "sacct"), "-X", "-n", "-P", "-o", "JobID,JobName%200", "-S", "now-1hours"],
        capture_output=True, text=True, check=True,
        env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"},
    ).stdout
    return [line.split("|")[0] for line in out.splitlines()
            if "|" in line and line.split("|")[1].startswith(prefix)]


class Toucher:
    """Sets the heartbeat file's mtime every 0.3 s from a thread, as a shared filesystem's
    attribute cache (an hour-old mtime) or a plain ``touch`` (a fresh one) would show it."""

    def __init__(self, path: str, when: str) -> None:
        self.path, self.when = path, when
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(0.3):
            subprocess.run(["touch", "-c", "-d", self.when, self.path], check=False)

    def __enter__(self) -> "Toucher":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
