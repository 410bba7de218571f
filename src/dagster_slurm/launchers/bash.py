"""The default launcher: run the payload once, as a plain process, inside the job script."""

from __future__ import annotations

from pydantic import Field, field_validator

from dagster_slurm.launchers.base import ComputeLauncher, ExecutionPlan
from dagster_slurm.launchers.script import render_prologue, render_template

BASH_TEMPLATE = "bash_launcher.sh"
"""Template of the bash launcher's part of the script (after the common prologue)."""


class BashLauncher(ComputeLauncher):
    """Runs the payload once, on the host that runs the job script.

    In ``slurm`` mode that is the first node of the allocation; a payload that wants the
    other nodes can call ``srun`` itself. The payload runs in a process group of its own,
    receives the drain and cancellation signals the script gets, and its exit status
    becomes the job's.
    """

    pre_start_commands: list[str] = Field(
        default_factory=list,
        description=(
            "Shell lines run before the payload, after the environment is exported and the "
            "activation script sourced (e.g. 'module load cuda/12.2'). They are your code, "
            "not data: they run verbatim in the job's shell, in order, without stopping at "
            "a failing line (write '|| exit 1' to stop). An 'exit N' ends the job with "
            "status N."
        ),
    )

    @field_validator("pre_start_commands")
    @classmethod
    def _check_pre_start_commands(cls, value: list[str]) -> list[str]:
        for index, line in enumerate(value):
            if "\0" in line:
                raise ValueError(f"pre_start_commands[{index}]={line!r}: contains a NUL character")
        return value

    def render(self, plan: ExecutionPlan) -> str:
        """The job script: the common prologue, the setup lines, then the payload."""
        return render_template(
            BASH_TEMPLATE,
            {"pre_start": "\n".join(self.pre_start_commands)},
            {"prologue": render_prologue(plan, launcher="bash")},
        )


def resolve_launcher(*choices: ComputeLauncher | None) -> ComputeLauncher:
    """The first launcher in ``choices`` that is not None (e.g. the asset's, then the
    resource's default), or a :class:`BashLauncher` with default settings."""
    for choice in choices:
        if choice is not None:
            return choice
    return BashLauncher()
