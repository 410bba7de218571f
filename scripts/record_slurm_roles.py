"""Record real Slurm output per job role for the parsers' golden files
(tests/unit/slurm/golden/<release>/roles/).

Runs against a dev cluster's login node over ssh (the ``SLURM_EDGE_NODE_*`` variables of
``dagster-slurm dev-cluster env``): submits a few tiny jobs in partition ``cpu`` (one
running, one pending, one held, one completed with an srun step, one failed, one cancelled,
one timed out), records the output of every command the library parses, built with the
library's own argv builders, then cancels every job it submitted. Each output goes to its
own file; ``manifest.json`` lists the command, the exit status and the stream of each, and
the jobs by role.

    eval "$(dagster-slurm dev-cluster env)"
    python scripts/record_slurm_roles.py tests/unit/slurm/golden
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

from dagster_slurm.slurm.commands import (
    SbatchSpec,
    sacct_argv,
    sbatch_argv,
    scancel_argv,
    scontrol_show_config_argv,
    squeue_argv,
    squeue_observe_argv,
    squeue_state_argv,
)
from dagster_slurm.slurm.test_only import TEST_ONLY_ENV, TEST_ONLY_SCRIPT
from dagster_slurm.slurm.version import VERSION_ARGV, SlurmVersion, parse_slurm_version

SCRIPTS = {
    "running": "#!/bin/sh\nsleep 600\n",
    "pending": "#!/bin/sh\ntrue\n",
    "held": "#!/bin/sh\ntrue\n",
    "completed": "#!/bin/sh\nsrun true\necho done\n",
    "failed": "#!/bin/sh\nexit 3\n",
    "cancelled": "#!/bin/sh\nsleep 600\n",
    "timeout": "#!/bin/sh\nsleep 600\n",
}
EXTRA = {"pending": ("--begin=now+3600",)}


def ssh_argv() -> list[str]:
    env = os.environ
    return ["ssh", "-i", env["SLURM_EDGE_NODE_KEY_PATH"],
            "-o", f"UserKnownHostsFile={env['SLURM_EDGE_NODE_KNOWN_HOSTS'].strip()}",
            "-o", "BatchMode=yes", "-p", env["SLURM_EDGE_NODE_PORT"],
            f"{env.get('SLURM_EDGE_NODE_USER', 'dslurm')}@{env.get('SLURM_EDGE_NODE_HOST', '127.0.0.1')}"]


def remote(argv: list[str], stdin: str = "", env: dict[str, str] | None = None):
    command = shlex.join(argv)
    if env:
        command = "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + command
    proc = subprocess.run([*ssh_argv(), command], input=stdin.encode(), capture_output=True,
                          timeout=120)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


class Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.manifest: dict = {"recordings": {}, "jobs": {}}

    def record(self, name: str, argv: list[str], *, stream: str = "stdout", stdin: str = "",
               env: dict[str, str] | None = None) -> tuple[int, str, str]:
        rc, out, err = remote(argv, stdin, env)
        text = out if stream == "stdout" else err
        (self.out / f"{name}.txt").write_text(text)
        self.manifest["recordings"][name] = {
            "argv": argv, "env": env or {}, "rc": rc, "stream": stream, "file": f"{name}.txt",
            "other_stream": (err if stream == "stdout" else out)[-2000:],
        }
        print(f"{name}: rc={rc} {len(text)} bytes", file=sys.stderr)
        return rc, out, err


def main() -> int:
    root = Path(sys.argv[1])
    rc, out, err = remote(list(VERSION_ARGV))
    version = parse_slurm_version(out)
    if version is None:
        print(f"no version: {out!r} {err!r}", file=sys.stderr)
        return 1
    target = root / version.series / "roles"
    target.mkdir(parents=True, exist_ok=True)
    rec = Recorder(target)
    rec.manifest["version"] = str(version)
    rec.record("version", list(VERSION_ARGV))
    prefix = f"golden-{secrets.token_hex(3)}"
    names = []
    try:
        ids = submit_all(rec, prefix, names)
        settle(ids)
        record_outputs(rec, ids, names, version)
    finally:
        for name in names:
            remote(scancel_argv(job_name=name))
        (target / "manifest.json").write_text(json.dumps(rec.manifest, indent=2, sort_keys=True) + "\n")
    left = remote(["squeue", "--noheader", "--format=%i %j", "--me"])[1]
    print("left in the queue:", [line for line in left.splitlines() if prefix in line],
          file=sys.stderr)
    return 0


def submit_all(rec: Recorder, prefix: str, names: list[str]) -> dict[str, str]:
    ids = {}
    for role, script in SCRIPTS.items():
        name = f"{prefix}-{role}"
        names.append(name)
        spec = SbatchSpec(job_name=name, script_path="unused", partition="cpu",
                          time_limit="00:01:00" if role == "timeout" else "00:10:00",
                          cpus_per_task=1, mem="100M", comment=f"tok-{role}",
                          output="/dev/null", hold=role == "held",
                          extra_directives=EXTRA.get(role, ()))
        argv = sbatch_argv(spec, script_on_stdin=True)
        rc, out, err = rec.record(f"sbatch_parsable_{role}", argv, stdin=script)
        ids[role] = out.strip().split(";")[0]
        if role == "cancelled":
            time.sleep(3)
            remote(scancel_argv([ids[role]]))
    rec.manifest["jobs"] = ids
    return ids


def settle(ids: dict[str, str]) -> None:
    """Wait until completed, failed, cancelled and timeout have ended (at most ~150 s)."""
    deadline = time.monotonic() + 150
    ended = {"completed", "failed", "cancelled", "timeout"}
    while time.monotonic() < deadline:
        out = remote(["squeue", "--noheader", "--format=%i|%T", "--states=all",
                      f"--jobs={','.join(ids.values())}"])[1]
        states = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        if all(states.get(ids[r]) not in ("PENDING", "RUNNING", "COMPLETING", None) for r in ended) \
                and states.get(ids["running"]) == "RUNNING":
            time.sleep(2)  # accounting catches up
            return
        time.sleep(3)
    print("not every job ended in time", states, file=sys.stderr)


def record_outputs(rec: Recorder, ids: dict[str, str], names: list[str],
                   version: SlurmVersion) -> None:
    every = list(ids.values())
    rec.record("squeue", squeue_argv(names, version=version))
    rec.record("squeue_observe", squeue_observe_argv(names, version=version))
    state_argv = squeue_state_argv(names, [*every, "999999"], version=version)
    rec.record("squeue_state", state_argv)
    rec.record("squeue_only_job_state_raw",
               ["squeue", "--only-job-state", "--format=%i|%T", "--states=all",
                f"--jobs={','.join(every)}"], stream="stdout")
    rec.record("squeue_only_job_state_stderr",
               ["squeue", "--only-job-state", "--format=%i|%T", "--states=all",
                f"--jobs={','.join(every)}"], stream="stderr")
    rec.record("squeue_purged_id", ["squeue", "--noheader", "--jobs=999999"], stream="stderr")
    rec.record("sacct", sacct_argv(every, version=version))
    rec.record("sacct_22_05_fields", sacct_argv(every))
    rec.record("scontrol_show_config", scontrol_show_config_argv(version=version))
    rec.record("scontrol_show_job", ["scontrol", "show", "job", ids["running"]])
    rec.record("scontrol_show_job_oneliner", ["scontrol", "-o", "show", "job",
                                               ids["running"]])
    rec.record("scontrol_show_node_oneliner", ["scontrol", "-o", "show", "node"])
    rec.record("sinfo", ["sinfo"])
    rec.record("sinfo_nodes", ["sinfo", "-h", "-N", "-o", "%N|%P|%T|%c|%m"])
    runnable = SbatchSpec(job_name="golden-test-only", script_path="unused", partition="cpu",
                          time_limit="00:01:00", cpus_per_task=1, mem="100M")
    rec.record("test_only_runnable", sbatch_argv(runnable, test_only=True, script_on_stdin=True),
               stream="stderr", stdin=TEST_ONLY_SCRIPT, env=dict(TEST_ONLY_ENV))
    refused = SbatchSpec(job_name="golden-test-only", script_path="unused", partition="nosuch",
                         time_limit="00:01:00")
    rec.record("test_only_bad_partition", sbatch_argv(refused, test_only=True, script_on_stdin=True),
               stream="stderr", stdin=TEST_ONLY_SCRIPT, env=dict(TEST_ONLY_ENV))
    too_big = SbatchSpec(job_name="golden-test-only", script_path="unused", partition="cpu",
                         time_limit="00:01:00", num_nodes=9)
    rec.record("test_only_too_big", sbatch_argv(too_big, test_only=True, script_on_stdin=True),
               stream="stderr", stdin=TEST_ONLY_SCRIPT, env=dict(TEST_ONLY_ENV))
    rec.record("squeue_json_supported", ["squeue", "--json", "--jobs", ids["running"]],
               stream="stderr")
    rec.record("sacct_json_supported", ["sacct", "--json", "--jobs", ids["completed"]],
               stream="stderr")


if __name__ == "__main__":
    sys.exit(main())
