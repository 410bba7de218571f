"""OpenSSH user certificates next to the key: checked, and renewed when asked, before a login.

A key at ``key_path`` may come with a certificate signed by the site's SSH certificate
authority (step-ca, Vault, a site's own signer): the file ``SSHTarget.certificate_path``
when set (``CertificateFile`` of an SSH config file), else ``<key_path>-cert.pub``
(:func:`certificate_file`); paramiko offers the certificate with the key
(:func:`dagster_slurm.transport.ssh_login.load_key`). Such
certificates are often short-lived. Before every login (the first one and each reconnect)
:func:`prepare_certificate` reads the certificate's validity again (nothing is cached
between logins, so a certificate renewed in the meantime is seen) and:

* with no renewal command: a certificate that has expired or is not valid yet fails the
  login with :class:`~dagster_slurm.errors.CertificateError`, naming the file and the time,
  before any connection is attempted; a missing certificate file is not an error (the key
  is offered alone);
* with a renewal command (``SSHTarget.certificate_renew_command``): when the file is
  missing or expires within ``certificate_min_validity`` seconds, the command is run on
  this machine (an argument list, no shell; no terminal and no input, so it cannot wait on
  a prompt; at most :data:`RENEW_TIMEOUT` seconds), then the certificate is read again. A
  command that fails, or that leaves no valid certificate, is a
  :class:`~dagster_slurm.errors.CertificateError` naming the command, its exit status and
  the last lines it wrote to stderr.

The validity is read with ``ssh-keygen -L`` (paramiko loads certificates but does not
expose their validity), run with ``TZ=UTC`` so that its times are UTC. Without
``ssh-keygen`` on the PATH the validity is unknown: a warning is logged, the login goes
ahead, and a configured renewal command runs before every login.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from dagster_slurm.errors import CertificateError
from dagster_slurm.transport.ssh_login import failure
from dagster_slurm.transport.ssh_target import SSHTarget

UTC = timezone.utc

log = logging.getLogger("dagster_slurm.ssh")

CERTIFICATE_SUFFIX = "-cert.pub"
"""The certificate of the key ``K`` is the file ``K-cert.pub``, as OpenSSH names it."""

RENEW_TIMEOUT = 120.0
"""Seconds a renewal command may run before it is killed and the login fails."""

READ_TIMEOUT = 30.0
"""Seconds ``ssh-keygen -L`` may take to print a certificate."""

STDERR_LINES = 10
"""Lines of a failed command's stderr shown in the error."""

_TIME_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S")


def certificate_path(key_path: str) -> str:
    """The certificate file of the key ``key_path`` by OpenSSH's naming (``~`` expanded)."""
    return os.path.expanduser(key_path) + CERTIFICATE_SUFFIX


def certificate_file(target: SSHTarget) -> str | None:
    """The certificate file of ``target``'s key (``~`` expanded): ``certificate_path`` when
    set, else :func:`certificate_path` of ``key_path``; None without ``key_path``."""
    if not target.key_path:
        return None
    if target.certificate_path:
        return os.path.expanduser(target.certificate_path)
    return certificate_path(target.key_path)


def shown_time(moment: datetime) -> str:
    """``2026-01-31 14:05:00 UTC``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class Validity:
    """When a certificate is valid: from ``valid_after`` (None: always) until
    ``valid_before`` (None: forever), both in UTC."""

    path: str
    valid_after: datetime | None
    valid_before: datetime | None

    def remaining(self, now: datetime) -> float:
        """Seconds from ``now`` until it expires (negative once expired; inf for forever)."""
        if self.valid_before is None:
            return math.inf
        return (self.valid_before - now).total_seconds()

    def problem(self, now: datetime) -> str | None:
        """Why it cannot be used at ``now`` (expired, not valid yet); None when it can."""
        if self.valid_before is not None and now >= self.valid_before:
            return f"the certificate {self.path} expired at {shown_time(self.valid_before)}"
        if self.valid_after is not None and now < self.valid_after:
            return (f"the certificate {self.path} is not valid before "
                    f"{shown_time(self.valid_after)}")
        return None


def _parse_time(text: str) -> datetime:
    for form in _TIME_FORMATS:
        try:
            return datetime.strptime(text, form).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise ValueError(f"unknown time format {text!r}")


def parse_validity(path: str, listing: str) -> Validity:
    """The validity in ``listing``, the output of ``ssh-keygen -L`` (run with ``TZ=UTC``):
    its ``Valid:`` line reads ``forever``, ``from T1 to T2``, ``after T1`` or
    ``before T2``. Raises :class:`ValueError` when there is no such line it understands."""
    for line in listing.splitlines():
        head, _, rest = line.strip().partition(":")
        if head != "Valid":
            continue
        words = rest.split()
        if words == ["forever"]:
            return Validity(path, None, None)
        if len(words) == 4 and words[0] == "from" and words[2] == "to":
            return Validity(path, _parse_time(words[1]), _parse_time(words[3]))
        if len(words) == 2 and words[0] == "after":
            return Validity(path, _parse_time(words[1]), None)
        if len(words) == 2 and words[0] == "before":
            return Validity(path, None, _parse_time(words[1]))
        raise ValueError(f"unexpected validity line {line.strip()!r}")
    raise ValueError("no 'Valid:' line")


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-STDERR_LINES:]) or "(nothing)"


def read_validity(target: SSHTarget, path: str) -> Validity | None:
    """The validity of the certificate ``path``; None when ``ssh-keygen`` is not installed.
    Raises :class:`CertificateError` when ``ssh-keygen -L`` cannot read the file."""
    program = shutil.which("ssh-keygen")
    if program is None:
        log.warning("ssh-keygen is not on the PATH: the validity of the SSH certificate %s "
                    "is not checked before logging in to %s", path, target.label)
        return None
    try:
        done = subprocess.run(
            [program, "-L", "-f", path], stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=READ_TIMEOUT, env={**os.environ, "TZ": "UTC"}, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise failure(target, f"the certificate {path} could not be read with ssh-keygen -L "
                      f"({exc})", "the file and the ssh-keygen installation",
                      kind=CertificateError) from None
    if done.returncode != 0:
        raise failure(target, f"the certificate {path} cannot be read (ssh-keygen -L exited "
                      f"with status {done.returncode}: {_tail(done.stderr)})",
                      "that the file is an OpenSSH certificate of the key at key_path",
                      kind=CertificateError)
    try:
        return parse_validity(path, done.stdout)
    except ValueError as exc:
        raise failure(target, f"the validity of the certificate {path} cannot be read from "
                      f"ssh-keygen -L ({exc})", "the file and the ssh-keygen version",
                      kind=CertificateError) from None


def _run_renewal(target: SSHTarget, command: Sequence[str], reason: str) -> tuple[int, str]:
    """Run the renewal command; its exit status and stderr (stdout when stderr is empty).
    Raises :class:`CertificateError` when it cannot be started, times out or fails."""
    log.info("renewing the SSH certificate for %s (%s): running %s", target.label, reason,
             list(command))
    named = f"the certificate renewal command {list(command)!r} (certificate_renew_command)"
    try:
        process = subprocess.Popen(  # noqa: S603 - the configured argv, run without a shell
            list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
    except OSError as exc:
        raise failure(target, f"{named} could not be started ({exc.strerror or exc})",
                      "that the program exists on this machine and is executable",
                      kind=CertificateError) from None
    try:
        stdout, stderr = process.communicate(timeout=RENEW_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise failure(target, f"{named} did not finish within {RENEW_TIMEOUT:g} s and was "
                      f"killed; its last output: {_tail(stderr or stdout)}",
                      "that the command runs without input (it gets no terminal and no "
                      "stdin, so it cannot ask for a password or open a browser and wait)",
                      kind=CertificateError) from None
    output = stderr if stderr.strip() else stdout
    if process.returncode != 0:
        raise failure(target, f"{named} exited with status {process.returncode}: "
                      f"{_tail(output)}", "the command's own output above, and that it runs "
                      "without input (no terminal, no stdin)", kind=CertificateError)
    return process.returncode, output


def prepare_certificate(target: SSHTarget, *, now: datetime | None = None) -> None:
    """Check (and renew, when ``target`` has a renewal command) the certificate of
    ``target.key_path`` (:func:`certificate_file`) before a login; see the module
    docstring. Nothing to do without ``key_path``."""
    path = certificate_file(target)
    if path is None:
        return
    command = target.certificate_renew_command
    exists = os.path.exists(path)
    validity = read_validity(target, path) if exists else None
    moment = now or datetime.now(UTC)
    if command:
        minimum = target.certificate_min_validity
        if not exists:
            reason = f"{path} does not exist"
        elif validity is None:
            reason = "its validity cannot be read without ssh-keygen"
        elif validity.remaining(moment) < minimum:
            reason = f"{path} expires in {validity.remaining(moment):.0f} s, within {minimum:g} s"
        else:
            return
        status, output = _run_renewal(target, command, reason)
        after = f"{list(command)!r} (certificate_renew_command) exited with status {status}"
        if not os.path.exists(path):
            raise failure(target, f"the certificate renewal command {after}, but {path} "
                          f"does not exist; its output: {_tail(output)}",
                          "that the command writes the certificate to that file",
                          kind=CertificateError)
        validity = read_validity(target, path)
        moment = now or datetime.now(UTC)
        problem = validity.problem(moment) if validity is not None else None
        if problem:
            raise failure(target, f"{problem}, after the certificate renewal command {after}; "
                          f"its output: {_tail(output)}",
                          "that the command writes a fresh certificate to that file",
                          kind=CertificateError)
        return
    problem = validity.problem(moment) if validity is not None else None
    if problem:
        raise failure(target, problem, "the certificate: sign a fresh one, or set "
                      "certificate_renew_command to renew it before each login",
                      kind=CertificateError)
