"""Where the files of one invocation live and the job name it gets (pure); the run and step
they belong to are read from the context by :mod:`dagster_slurm.jobs.contexts`."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str, limit: int = 60) -> str:
    """``text`` reduced to letters, digits, ``_ . -`` (a path component and a Slurm name)."""
    cleaned = _UNSAFE.sub("-", text).strip("-.") or "step"
    return cleaned[:limit]


@dataclass(frozen=True)
class InvocationPaths:
    """Files of one ``compute.run`` under ``<base>/runs/<run>/<step>/<invocation>/``."""

    base: str
    run_dir: str
    step_dir: str
    job_dir: str

    @classmethod
    def create(cls, base: str, run_id: str, step_key: str, invocation: str | None = None) -> InvocationPaths:
        run_dir = f"{base.rstrip('/')}/runs/{safe_name(run_id, 64)}"
        step_dir = f"{run_dir}/{safe_name(step_key, 100)}"
        job_dir = f"{step_dir}/{invocation or uuid.uuid4().hex[:12]}"
        return cls(base.rstrip("/"), run_dir, step_dir, job_dir)

    @classmethod
    def create_under(
        cls, parent: str, base: str, step_key: str, invocation: str | None = None
    ) -> InvocationPaths:
        """Files of one invocation under ``<parent>/<step>/<invocation>/`` (``base``: the
        root removals stay inside)."""
        step_dir = f"{parent.rstrip('/')}/{safe_name(step_key, 100)}"
        job_dir = f"{step_dir}/{invocation or uuid.uuid4().hex[:12]}"
        return cls(base.rstrip("/"), parent.rstrip("/"), step_dir, job_dir)

    def file(self, name: str) -> str:
        return f"{self.job_dir}/{name}"

    @property
    def invocation(self) -> str:
        """The invocation's directory name (unique within its step directory)."""
        return self.job_dir.rsplit("/", 1)[1]

    @property
    def script(self) -> str:
        return self.file("dagster_slurm_job.sh")

    @property
    def pid(self) -> str:
        return self.file("payload.pgid")

    @property
    def reserved(self) -> frozenset[str]:
        """Names of the library's own files in the job directory (an upload must not clash)."""
        return frozenset(p.rsplit("/", 1)[1] for p in (
            self.script, self.context, self.messages, self.stdout, self.stderr,
            self.status, self.drain, self.record, self.pid, self.heartbeat, self.ended_by,
        ))

    def upload_target(self, name: str) -> str:
        """Where an uploaded payload named ``name`` goes; refuses the library's file names."""
        from dagster_slurm.errors import ConfigurationError

        if name in self.reserved:
            raise ConfigurationError(
                "payload_path", name, "clashes with a file of the library; rename the script"
            )
        return self.file(name)

    @property
    def context(self) -> str:
        return self.file("pipes_context.json")

    @property
    def messages(self) -> str:
        return self.file("pipes_messages.jsonl")

    @property
    def stdout(self) -> str:
        return self.file("stdout.log")

    @property
    def stderr(self) -> str:
        return self.file("stderr.log")

    @property
    def status(self) -> str:
        return self.file("exit_status")

    @property
    def drain(self) -> str:
        return self.file("drain_signal")

    @property
    def record(self) -> str:
        return self.file("job.json")

    @property
    def heartbeat(self) -> str:
        """Rewritten with new content by every status poll of the waiting step (asset
        scope); the job's watchdog ends the job when its content stops changing."""
        return self.file("heartbeat")

    @property
    def ended_by(self) -> str:
        """Written by the job's watchdog (``heartbeat``) when it cancelled the job."""
        return self.file("ended_by")


def job_name_for(run_id: str, step_key: str) -> str:
    """``dsl-<run id prefix>-<step>``: unique per run and step, valid as a Slurm job name."""
    return f"dsl-{safe_name(run_id, 8)}-{safe_name(step_key, 80)}"

