"""The step server of a run-scoped allocation: directory operations while idle, and how fast
it starts a step after a long idle spell.

On the dev cluster one run session (a ``BashLauncher`` allocation, no Ray) is started; then:

* its step server is traced (``strace -f -y -e trace=%file,getdents64 -p <pid>``, needs
  root or ptrace rights over the jobs' user) for ``--seconds`` while it is idle, and for
  ``--floor-seconds`` while it is held at its 0.1 s floor (a drain that cannot reach a
  running step yet keeps its retry every second due, so the loop stays at the floor). Printed
  per minute: listings of ``requests/`` (opening the directory), all file operations on the
  session directory (the shared filesystem of a real cluster), all file operations
  (``/proc``, ``/dev/null`` included) and programs started; the ratio idle/floor;
* the start latency of a step: from just before the request's round trip to the step's
  first line (``date +%s.%N``, same host), right after another step started (the floor),
  after ``--idle`` seconds without a request with the request waking the server (as the
  library does), and after as long without the wake (as a request written on another host
  than the server's). Medians of ``--repeat`` samples, ratios against the floor.

Needs the dev cluster (``eval "$(dagster-slurm dev-cluster env)"``) on this host (the trace
attaches to the server's process) and ``strace``. Run it with the library version to
measure; a version whose ``SlurmAllocation.launch`` has no ``wake`` has no wake-up either,
and its "no wake" row is then the same request as the others.
"""

import argparse
import inspect
import os
import re
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from dagster_slurm import SlurmQueueConfig, SlurmResource, SlurmRunAllocationConfig
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.session.core.allocation import SlurmAllocation, StepHandle, last_lines
from dagster_slurm.session.session import RunSession

STRACE = "/usr/bin/strace"
#: The probe step: its first line prints the wall clock, then it writes its status itself.
PROBE = """#!/bin/bash
date +%s.%N
printf '0\\n' > {status}.tmp && mv -f {status}.tmp {status}
"""
#: A step that never writes its step id file: a drain cannot reach it, so it stays due.
UNREACHABLE = "#!/bin/bash\nsleep {seconds}\n"


def server_pid(session_dir: str) -> int:
    """The pid of the bash running this session's step server (found in /proc)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 2 and argv[0].endswith(b"bash") and argv[1].endswith(b"step_server.sh") \
                and argv[1].startswith(session_dir.encode()):
            return int(proc.name)
    raise SystemExit(f"no step server of {session_dir} runs on this host")


def trace(pid: int, seconds: float, session_dir: str, requests_dir: str) -> dict[str, float]:
    """File operations of process ``pid`` and its children for ``seconds``, per minute."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        subprocess.run(["timeout", "-s", "INT", str(seconds), STRACE, "-f", "-qq", "-y",
                        "-e", "trace=%file,getdents64,execve", "-o", out.name, "-p", str(pid)],
                       check=False)
        lines = Path(out.name).read_text().splitlines()
    scale = 60.0 / seconds
    listing = re.compile(r'openat\([^,]*, "' + re.escape(requests_dir) + r'/?"')
    return {
        "listings": scale * sum(bool(listing.search(line)) for line in lines),
        "shared": scale * sum(_touches(line, session_dir) for line in lines),
        "all": scale * len(lines),
        "programs": scale * sum(" execve(" in line for line in lines),
    }


def _touches(line: str, directory: str) -> bool:
    """Whether the traced call ``line`` (``strace -y``) names a file under ``directory``: a
    path argument (a relative one counts by the working directory strace shows for
    ``AT_FDCWD``) or a descriptor open on one (``fstat``, ``getdents64`` of an open fd)."""
    cwd = re.search(r"AT_FDCWD<([^>]*)>", line)
    for path in re.findall(r'"([^"]*)"', line.split(") = ")[0]):
        if path.startswith("/") or cwd is None:
            if path.startswith(directory):
                return True
        elif path and cwd.group(1).startswith(directory):
            return True
    call = line.split(") = ")[0]
    return any(target.startswith(directory)
               for target in re.findall(r"\(\d+<([^>]*)>", call))


def launch_probe(allocation: SlurmAllocation, name: str, wake: bool) -> tuple[float, StepHandle]:
    """Request one probe step; returns the wall clock just before the request and its handle."""
    paths = allocation.invocation(name)
    script = PROBE.format(status=paths.status)
    kwargs = {"wake": wake} if "wake" in inspect.signature(allocation.launch).parameters else {}
    before = time.time()
    return before, allocation.launch(paths, script, name=name, **kwargs)


def probe(allocation: SlurmAllocation, name: str, wake: bool = True) -> float:
    """Seconds from the request to the probe step's first line."""
    before, handle = launch_probe(allocation, name, wake)
    allocation.wait(handle)
    (out,) = last_lines(allocation.scheduler.agent, [handle.paths.stdout], 1)
    return float(out.strip()) - before


def median_of(repeat: int, sample: Callable[[int], float]) -> float:
    return statistics.median(sample(i) for i in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="idle trace length")
    parser.add_argument("--floor-seconds", type=float, default=15.0, help="floor trace length")
    parser.add_argument("--idle", type=float, default=8.0,
                        help="idle seconds before each 'after idle' request (the server "
                             "reaches its 2 s interval after about 3 s)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    queue = SlurmQueueConfig(partition=os.environ.get("SLURM_PARTITION", "cpu"),
                             time_limit="00:15:00", cpus=1, mem="500M")
    slurm = SlurmResource.from_env(queue=queue)
    config = SlurmRunAllocationConfig(heartbeat_timeout=300, heartbeat_interval=5)
    session = RunSession(slurm, f"bench-{uuid.uuid4().hex[:8]}", config, BashLauncher(),
                         activation=lambda: None)
    try:
        allocation = session.allocation
        job_dir = session.paths.job_dir(allocation.job_id)
        pid = server_pid(session.paths.session_dir)
        probe(allocation, "warmup")

        # Latency: right after a step started (the floor), after an idle spell with and
        # without the wake-up.
        def floor_sample(i: int) -> float:
            probe(allocation, f"lead-{i}")
            return probe(allocation, f"floor-{i}")

        def idle_sample(wake: bool) -> Callable[[int], float]:
            def sample(i: int) -> float:
                time.sleep(args.idle)
                return probe(allocation, f"idle-{'wake' if wake else 'nowake'}-{i}", wake)
            return sample

        floor = median_of(args.repeat, floor_sample)
        woken = median_of(args.repeat, idle_sample(True))
        unwoken = median_of(args.repeat, idle_sample(False))

        # Directory operations: idle, then held at the floor by a drain that is due.
        time.sleep(args.idle)
        idle = trace(pid, args.seconds, session.paths.session_dir, f"{job_dir}/requests")
        paths = allocation.invocation("unreachable")
        allocation.launch(paths, UNREACHABLE.format(seconds=int(args.floor_seconds) + 30),
                          name="unreachable")
        time.sleep(1.0)
        allocation.request_drain()
        time.sleep(1.0)
        held = trace(pid, args.floor_seconds, session.paths.session_dir, f"{job_dir}/requests")
    finally:
        session.close(cancel=True)
        slurm.close()

    print(f"step server of allocation {allocation.job_id}, pid {pid}")
    print(f"{'per minute':<34} {'idle':>8} {'floor':>8} {'ratio':>6}")
    for key, label in (("listings", "listings of requests/"),
                       ("shared", "file ops on the session directory"),
                       ("all", "file ops, all (/proc, /dev/null)"),
                       ("programs", "programs started")):
        ratio = idle[key] / held[key] if held[key] else float("nan")
        print(f"{label:<34} {idle[key]:>8.1f} {held[key]:>8.1f} {ratio:>6.2f}")
    print(f"{'step start latency (median s)':<34} {'value':>8} {'ratio':>15}")
    print(f"{'  floor (right after another step)':<34} {floor:>8.3f} {1.0:>15.2f}")
    print(f"{'  after ' + format(args.idle, 'g') + ' s idle, woken':<34} {woken:>8.3f} "
          f"{woken / floor:>15.2f}")
    print(f"{'  after ' + format(args.idle, 'g') + ' s idle, no wake':<34} {unwoken:>8.3f} "
          f"{unwoken / floor:>15.2f}")


if __name__ == "__main__":
    main()
