"""The Spark launcher: a standalone Spark cluster for the payload, started by the job script.

In ``slurm`` mode the job script (on the allocation's first node) starts a Spark master in
an ``srun --overlap`` step on its own node, waits until the master is alive, then starts
one Spark worker on every node of the allocation in a second step (one task per node),
and waits until every worker has registered with the master. Each worker offers the CPUs
Slurm granted on its node (``SLURM_CPUS_ON_NODE``) and the memory Slurm granted there minus
a margin for the JVMs that are not executors (:func:`worker_memory_mb`). The payload then
runs on the first node with ``SPARK_MASTER_URL`` set and a ``spark-defaults.conf`` in
``SPARK_CONF_DIR`` (``<job dir>/spark-conf``) that names the master, the driver's address
and ports and the executor settings, so ``SparkSession.builder.getOrCreate()`` in a Python
payload, and ``spark-submit`` in a command payload, both use the cluster.

A ``.py`` payload runs with ``python`` as a PySpark driver (PySpark itself starts the JVM
through ``spark-submit``, which reads the same file); ``spark-submit`` is not wrapped
around it. Afterwards, and on a failed start, the workers and then the master are stopped
with ``scancel --signal=TERM`` on their steps (every JVM of a step gets TERM and runs its
shutdown hooks; workers end their executors); after :data:`SPARK_STOP_GRACE_SECONDS` the
steps are ended. Every Spark process lives in a job step, so Slurm's process tracking
also ends them when the job is cancelled.

In ``local`` mode no master or worker runs: the payload gets ``local[N]`` (``N`` from
``executor_cores`` times ``num_executors``, else ``*``).

Script contract, beyond the common one (``templates/job_common.sh``):

* exit status :data:`SPARK_START_FAILED_STATUS` when the cluster does not come up (a step
  ended early, or the master or a worker did not come up within ``startup_timeout``);
  the job's stderr says which and shows the last lines of the master's and workers' logs;
* stdout gets ``Spark master web UI: http://<address>:<port>`` and an ``ssh -L`` hint;
* the master's output goes to ``spark-master.log``, the workers' to ``spark-workers.log``
  in the job directory (and, prefixed, to the job's stderr); each worker's work directory
  (executor logs, application files) is ``spark-work/<node>`` in the job directory, its
  scratch space (``SPARK_LOCAL_DIRS``) ``/tmp/dsspark-<job>-<node>``, removed afterwards;
* ``spark-class`` must be in ``spark_home/bin``, or PySpark importable after activation.

Ports: every master and worker takes a port block the way Ray nodes do
(:mod:`dagster_slurm.launchers.ray_ports`, the same template and lock files, so Spark and
Ray clusters on one node never pick the same block); the offsets are
:data:`SPARK_MASTER_OFFSETS` and :data:`SPARK_WORKER_OFFSETS`. The driver runs on the
master's node and uses ports of the master's block. Executors bind ports the kernel
assigns (the ephemeral range, outside every block).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan
from dagster_slurm.launchers.ray_ports import PortStrategy, RayPortConfig, port_block_functions
from dagster_slurm.launchers.script import render_prologue, render_template

SPARK_TEMPLATE = "spark_launcher.sh"
"""The Spark launcher's part of the job script (after the common prologue)."""
SPARK_NODE_TEMPLATE = "spark_node.sh"
"""Functions that run in the master's and the workers' job steps."""

SPARK_START_FAILED_STATUS = 123
"""Exit status of a job whose Spark cluster did not come up (the same as Ray's)."""

SPARK_STOP_GRACE_SECONDS = 15
"""How long the script waits for the Spark steps to stop after TERM before ending them."""

SPARK_MASTER_OFFSETS: Mapping[str, int] = MappingProxyType(
    {"master": 0, "master_ui": 1, "driver": 2, "driver_block_manager": 3, "driver_ui": 4}
)
"""Ports of the master's block: the master's own two, then the driver's three."""

SPARK_WORKER_OFFSETS: Mapping[str, int] = MappingProxyType({"worker": 0, "worker_ui": 1})
"""Ports of a worker's block."""

WORKER_MEMORY_MARGIN_MB = 1024
"""Most memory (MiB) kept back from a worker for the JVMs that are not executors."""

SPARK_MASTER_UI_PREFIX = "Spark master web UI:"
"""Start of the job script's stdout line with the Spark master's web UI."""

SPARK_TUNNEL_PREFIX = "To reach the Spark UI from your machine:"
"""Start of the stdout line with the ``ssh -L`` command that reaches the master's UI."""

SPARK_NOTABLE_PREFIXES = (SPARK_MASTER_UI_PREFIX, SPARK_TUNNEL_PREFIX)
"""Starts of the launcher's stdout lines that also belong in the Dagster log."""

SPARK_UI_FORMAT = SPARK_MASTER_UI_PREFIX + " http://%s:%s\\n"
"""``printf`` format of the UI line (arguments: master address, UI port)."""

SPARK_TUNNEL_FORMAT = SPARK_TUNNEL_PREFIX + " ssh -L 8080:%s:%s <login-host>, then open %s\\n"
"""``printf`` format of the tunnel line (arguments: master address, UI port, local URL)."""

_USE = "is set by the launcher; use "
_SET = "is set by the launcher"

#: ``spark_conf`` keys the launcher writes itself, with what to use instead.
SPARK_MANAGED_CONF: Mapping[str, str] = MappingProxyType(
    {
        "spark.master": _SET + " (the job's own master, or local[N] in local mode)",
        "spark.executor.memory": _USE + "executor_memory",
        "spark.executor.cores": _USE + "executor_cores",
        "spark.driver.memory": _USE + "driver_memory",
        "spark.cores.max": _USE + "num_executors (with executor_cores)",
        "spark.driver.host": _SET + " (the master's node)",
        "spark.driver.bindAddress": _SET + " (the master's node)",
        "spark.driver.port": _SET + " (from the master's port block)",
        "spark.driver.blockManager.port": _SET + " (from the master's port block)",
        "spark.ui.port": _SET + " (from the master's port block)",
        "spark.pyspark.python": _SET + " (the python of the job's environment)",
    }
)

_MEMORY = re.compile(r"[1-9][0-9]*(?:[kmgt]b?)", re.IGNORECASE)
_CONF_KEY = re.compile(r"spark\.[A-Za-z0-9_.\-]+")


def _has_control(text: str) -> bool:
    return any(ord(char) < 32 or ord(char) == 127 for char in text)


def worker_memory_mb(granted_mb: int) -> int:
    """Memory (MiB) a worker offers to executors on a node where Slurm granted
    ``granted_mb``: the grant minus a quarter of it, at most :data:`WORKER_MEMORY_MARGIN_MB`
    (the worker's and master's own JVMs, the driver). The job script computes the same."""
    if granted_mb < 1:
        raise ValueError(f"granted_mb={granted_mb!r}: must be at least 1")
    return granted_mb - min(WORKER_MEMORY_MARGIN_MB, granted_mb // 4)


def conf_line(key: str, value: str) -> str:
    """One line of ``spark-defaults.conf`` (a Java properties file): ``key value`` with
    backslashes doubled, so that the value arrives as written."""
    return f"{key} {value.replace(chr(92), chr(92) * 2)}"


class SparkLauncher(ComputeLauncher):
    """Starts a standalone Spark cluster inside the job, runs the payload as its driver,
    then stops the cluster.

    ``slurm`` mode: a master on the first node and one worker per node; local mode:
    ``local[N]``, no cluster processes. The payload finds the cluster through
    ``SPARK_MASTER_URL`` and ``SPARK_CONF_DIR``. See the module documentation.

    The published package's ``master_url`` (connect to a Spark cluster outside the job) is
    refused with what to use instead.
    """

    removed_fields: ClassVar[Mapping[str, str]] = {
        "master_url": (
            "this launcher always starts a Spark cluster of its own inside the job. To use a "
            "cluster that already runs elsewhere, run the payload with BashLauncher() and "
            "give it the URL, e.g. extra_env={'SPARK_MASTER_URL': 'spark://host:7077'} "
            "read by SparkSession.builder.master(...) in the payload"
        ),
    }

    spark_home: str | None = Field(
        default=None,
        description=(
            "Spark installation on the cluster (holds bin/spark-class and "
            "bin/spark-submit). None: the PySpark package of the job's environment, found "
            "by importing pyspark after activation."
        ),
    )
    executor_memory: str | None = Field(
        default=None,
        description=(
            "Memory of each executor, a JVM size such as '2g' or '512m' "
            "(spark.executor.memory). None: Spark's default (1g)."
        ),
    )
    executor_cores: int | None = Field(
        default=None,
        description=(
            "Cores of each executor (spark.executor.cores). None: in slurm mode an "
            "executor takes all cores of its worker; in local mode local[*]."
        ),
    )
    driver_memory: str | None = Field(
        default=None,
        description=(
            "Memory of the driver JVM, a size such as '1g' (spark.driver.memory). None: "
            "Spark's default (1g)."
        ),
    )
    num_executors: int | None = Field(
        default=None,
        description=(
            "Executors for the payload in total; needs executor_cores (Spark's standalone "
            "master caps the application at num_executors * executor_cores cores). "
            "None: as many as the workers' cores allow."
        ),
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Further Spark properties for the payload ('spark.sql.shuffle.partitions': "
            "'8'), written to spark-defaults.conf. Keys start with 'spark.'; values are "
            "strings without control characters. Properties the launcher sets (spark.master, "
            "spark.executor.memory, ...) are refused with the field to use instead."
        ),
    )
    port_strategy: PortStrategy = Field(
        default="random",
        description=(
            "How the master and each worker pick their port block, as for RayLauncher: "
            "'random' (locked, checked for listeners), 'hash_jobid' or 'fixed'."
        ),
    )
    port_config: RayPortConfig = Field(
        default_factory=RayPortConfig,
        description=(
            "The port range blocks come from, the block size and the lock directory; the "
            "same blocks and lock files as Ray's, so Spark and Ray on one node never collide."
        ),
    )
    startup_timeout: float = Field(
        default=120.0,
        description=(
            "Seconds from the start of the script's Spark part until the master is alive "
            "and every worker has registered; the job fails after that."
        ),
    )

    @field_validator("spark_home")
    @classmethod
    def _check_home(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or _has_control(value)):
            raise ValueError(
                f"spark_home={value!r}: must be an absolute path without control characters"
            )
        return None if value is None else value.rstrip("/") or "/"

    @field_validator("executor_memory", "driver_memory")
    @classmethod
    def _check_memory(cls, value: str | None, info: Any) -> str | None:
        if value is not None and _MEMORY.fullmatch(value) is None:
            raise ValueError(
                f"{info.field_name}={value!r}: must be a JVM memory size such as '512m' or "
                "'2g' (a positive whole number with k, m, g or t)"
            )
        return value

    @field_validator("executor_cores", "num_executors")
    @classmethod
    def _check_count(cls, value: int | None, info: Any) -> int | None:
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ValueError(f"{info.field_name}={value!r}: must be a positive integer (or None)")
        return value

    @field_validator("spark_conf")
    @classmethod
    def _check_conf(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            where = f"spark_conf[{key!r}]"
            if _CONF_KEY.fullmatch(key) is None:
                raise ValueError(
                    f"{where}: not a Spark property name; use 'spark.' followed by letters, "
                    "digits, '.', '_' or '-'"
                )
            advice = SPARK_MANAGED_CONF.get(key)
            if advice is not None:
                raise ValueError(f"{where}: {key} {advice}")
            if _has_control(item) or not item.strip():
                raise ValueError(
                    f"{where}={item!r}: must be a non-blank value without control characters"
                )
        return dict(value)

    @field_validator("startup_timeout")
    @classmethod
    def _check_timeout(cls, value: float) -> float:
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"startup_timeout={value!r}: must be a positive number of seconds")
        return value

    @model_validator(mode="after")
    def _check_executors(self) -> SparkLauncher:
        if self.num_executors is not None and self.executor_cores is None:
            raise ValueError(
                f"num_executors={self.num_executors!r}: needs executor_cores (the standalone "
                "master limits an application by cores, num_executors * executor_cores)"
            )
        return self

    @property
    def local_master(self) -> str:
        """The master URL of local mode: ``local[N]`` or ``local[*]``."""
        if self.executor_cores is None:
            return "local[*]"
        return f"local[{self.executor_cores * (self.num_executors or 1)}]"

    def conf_lines(self) -> list[str]:
        """The payload's ``spark-defaults.conf`` lines that do not depend on the run (the
        script adds the master, the driver's address and ports)."""
        settings: dict[str, str] = {}
        if self.executor_memory is not None:
            settings["spark.executor.memory"] = self.executor_memory
        if self.executor_cores is not None:
            settings["spark.executor.cores"] = str(self.executor_cores)
        if self.num_executors is not None and self.executor_cores is not None:
            settings["spark.cores.max"] = str(self.num_executors * self.executor_cores)
        if self.driver_memory is not None:
            settings["spark.driver.memory"] = self.driver_memory
        settings.update(sorted(self.spark_conf.items()))
        return [conf_line(key, value) for key, value in settings.items()]

    def render(self, plan: ExecutionPlan) -> str:
        """The job script: the common prologue, the Spark cluster, the payload, the teardown."""
        return render_template(
            SPARK_TEMPLATE,
            {
                "startup_timeout": str(math.ceil(self.startup_timeout)),
                "stop_grace": str(SPARK_STOP_GRACE_SECONDS),
                "failed_status": str(SPARK_START_FAILED_STATUS),
                "local_master": self.local_master,
                "conf": self.conf_lines(),
                "ui_line": SPARK_UI_FORMAT,
                "tunnel_line": SPARK_TUNNEL_FORMAT,
                "memory_margin": str(WORKER_MEMORY_MARGIN_MB),
                "mode": plan.mode,
                "spark_home": self.spark_home or "",
            },
            {
                "prologue": render_prologue(plan, launcher="spark"),
                "ports": port_block_functions(self.port_strategy, self.port_config),
                "node": self.node_functions(),
            },
        )

    def node_functions(self) -> str:
        """The shell functions and settings of the master's and workers' steps (bash text)."""
        offsets = {**SPARK_MASTER_OFFSETS, **SPARK_WORKER_OFFSETS}
        return render_template(
            SPARK_NODE_TEMPLATE,
            {f"offset_{name}": str(value) for name, value in offsets.items()},
        )
