"""Driving ``dagster-slurm login`` at a real prompt: a pseudo-terminal, as a person would."""

import os
import pty
import re
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dagster_slurm.devcluster import DevCluster
from dagster_slurm.devcluster.info import DevClusterInfo
from dagster_slurm.devcluster.otp import read_secret, time_step, totp

CLI = [sys.executable, "-m", "dagster_slurm.cli"]


@dataclass
class Typed:
    """What the terminal showed and the command's exit status; ``asked_again``: after the
    last answer the same question came again (the answer was refused) and the command was
    stopped."""

    output: str
    exit_code: int
    asked_again: bool = False


def at_a_terminal(argv: list[str], env: Mapping[str, str], answers: list[tuple[str, Callable[[], str]]],
                  timeout: float = 60.0) -> Typed:
    """Run ``argv`` with a pseudo-terminal as its controlling terminal; each time the output
    matches the next pattern of ``answers``, type what its callable returns and Enter."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its terminal is the pty
        os.execvpe(argv[0], argv, dict(env))
    output = b""
    pending = list(answers)
    asked, typed_at, asked_again = "", 0, False
    deadline = time.monotonic() + timeout
    done, status = 0, 0
    try:
        while time.monotonic() < deadline and not done:
            done, status = os.waitpid(pid, os.WNOHANG)
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            if pending and re.search(pending[0][0], output.decode(errors="replace")[-400:]):
                asked, answer = pending.pop(0)
                os.write(fd, answer().encode() + b"\n")
                output += b"<typed>\n"
                typed_at = len(output)
            elif asked and re.search(asked, output[typed_at:].decode(errors="replace")):
                asked_again = True
                break
        if not done:
            done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    return Typed(output.decode(errors="replace"), os.waitstatus_to_exitcode(status),
                 asked_again)


def unused_code(info: DevClusterInfo) -> str:
    """A code pam_oath accepts now. It accepts the codes of the current step and of one
    step before and after (clock drift), each once: it keeps the last code used in its
    users file and refuses that one and older ones. So: the code of the first step after
    the last one used, when that is at most the next step; else wait for time to catch up.
    """
    paths = DevCluster(state_dir=info.state_dir).paths
    secret = read_secret(paths)
    fields = paths.otp_users.read_text().split()
    last_used = fields[5] if len(fields) > 5 else None
    now_step = time_step(time.time())
    used_steps = [s for s in range(now_step - 3, now_step + 4)
                  if last_used is not None and totp(secret, s * 30) == last_used]
    step = max(max(used_steps, default=now_step - 1) + 1, now_step)
    deadline = time.monotonic() + 100
    while time_step(time.time()) < step - 1:
        assert time.monotonic() < deadline, "no one-time code unused yet within 100 s"
        time.sleep(0.2)
    return totp(secret, step * 30)
