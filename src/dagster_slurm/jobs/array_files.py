"""The files of a partitioned run as a job array: one task directory per partition key (pure).

A run over several partition keys runs its payload once per key, as the tasks of one job
array (slurm mode) or as a pool of processes (local mode). Everything lives under the
invocation's job directory::

    <job_dir>/dagster_slurm_job.sh       the launcher's script, rendered once per array
    <job_dir>/array-<n>.tsv               the tasks of array n: line i is task index i
    <job_dir>/tasks/<position>/           one directory per key (its position in the run)
        pipes_context.json  pipes_messages.jsonl  stdout.log  stderr.log  exit_status

A line of a tasks file is ``<task directory>\\t<key, base64>\\t<Pipes context
parameter>\\t<Pipes messages parameter>``: the job script picks line
``SLURM_ARRAY_TASK_ID + 1`` and exports the key as ``DAGSTER_SLURM_PARTITION_KEY`` and the
two Pipes variables, so a key reaches its task verbatim whatever characters it holds (it is
never part of a command line or a script). The base64 alphabet and Dagster's encoded
parameters hold no tab and no newline.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from dagster_pipes import (
    DAGSTER_PIPES_CONTEXT_ENV_VAR,
    DAGSTER_PIPES_MESSAGES_ENV_VAR,
    PipesDefaultContextLoader,
    PipesDefaultMessageWriter,
    encode_param,
)

__all__ = ["ArrayLayout", "PartitionTask", "tasks_file_content"]

#: The environment variable a task's payload finds its partition key in (verbatim).
PARTITION_KEY_ENV = "DAGSTER_SLURM_PARTITION_KEY"


@dataclass(frozen=True)
class PartitionTask:
    """One partition key of the run and where its task's files are.

    ``position``: the key's place in the run's keys (0-based; also its task directory's
    name); ``key``: the partition key as Dagster gave it; ``dir``: the task directory.
    """

    position: int
    key: str
    dir: str

    @property
    def context(self) -> str:
        return f"{self.dir}/pipes_context.json"

    @property
    def messages(self) -> str:
        return f"{self.dir}/pipes_messages.jsonl"

    @property
    def stdout(self) -> str:
        return f"{self.dir}/stdout.log"

    @property
    def stderr(self) -> str:
        return f"{self.dir}/stderr.log"

    @property
    def status(self) -> str:
        """The task's exit status, written by the job script when the payload ended."""
        return f"{self.dir}/exit_status"

    def bootstrap_env(self) -> dict[str, str]:
        """The Pipes variables of this task's payload: its own context and messages files."""
        return {
            DAGSTER_PIPES_CONTEXT_ENV_VAR: encode_param(
                {PipesDefaultContextLoader.FILE_PATH_KEY: self.context}),
            DAGSTER_PIPES_MESSAGES_ENV_VAR: encode_param(
                {PipesDefaultMessageWriter.FILE_PATH_KEY: self.messages}),
        }


@dataclass(frozen=True)
class ArrayLayout:
    """Where the array files of one invocation are (``job_dir``: the invocation's
    directory, see :class:`~dagster_slurm.jobs.paths.InvocationPaths`)."""

    job_dir: str

    def task(self, position: int, key: str) -> PartitionTask:
        """The task of the key at ``position`` of the run."""
        return PartitionTask(position, key, f"{self.job_dir}/tasks/{position}")

    def tasks(self, keys: Sequence[str]) -> list[PartitionTask]:
        """One task per key, in the run's order."""
        return [self.task(position, key) for position, key in enumerate(keys)]

    def tasks_file(self, array: int) -> str:
        """The tasks file of the run's ``array``-th job array (0 for the first)."""
        return f"{self.job_dir}/array-{array}.tsv"

    def script(self, array: int) -> str:
        """The job script of the run's ``array``-th job array."""
        return f"{self.job_dir}/dagster_slurm_array_{array}.sh"


def tasks_file_content(tasks: Sequence[PartitionTask]) -> str:
    """The tasks file of an array whose task index ``i`` runs ``tasks[i]`` (see the module
    docstring for a line's fields)."""
    lines = []
    for task in tasks:
        env = task.bootstrap_env()
        key = base64.b64encode(task.key.encode("utf-8")).decode("ascii")
        lines.append("\t".join((str(task.position), key, env[DAGSTER_PIPES_CONTEXT_ENV_VAR],
                                env[DAGSTER_PIPES_MESSAGES_ENV_VAR])))
    return "\n".join(lines) + "\n"
