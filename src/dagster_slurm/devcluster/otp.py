"""The one-time codes of the ``otp`` login site: TOTP secret, pam_oath files, PAM service.

The ``otp`` site's sshd asks for the submitter's key and then, through PAM
(keyboard-interactive), for a time-based one-time code (RFC 6238: HMAC-SHA1, 30 s steps,
6 digits) checked by Debian's ``pam_oath``. The secret is generated once and kept in the
root-only secrets directory, hex encoded; :func:`totp` computes the code from it with the
standard library only. pam_oath accepts the codes of the current step and of one step
before and after, and each code once: it records the last code used in its users file and
refuses that code and older ones afterwards, so a second login needs the code of a later
step.

sshd must run this site's PAM stack, never the machine's own ``/etc/pam.d/sshd``. An sshd
that knows ``PAMServiceName`` (OpenSSH 9.8 and later) is told the service name in its
configuration; older ones use their program name as the service name, so they run through
a symbolic link of that name (:func:`program_link`). ``up`` asks the installed sshd which
of the two applies (:func:`dagster_slurm.devcluster.sshd.accepts_option`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
import time
from pathlib import Path

from dagster_slurm.devcluster.config import write_if_changed
from dagster_slurm.devcluster.errors import DevClusterError, NotRootError
from dagster_slurm.devcluster.layout import Paths

#: Name of the PAM service (``/etc/pam.d/<name>``) of the ``otp`` site.
PAM_SERVICE = "dagster-slurm-otp"
#: Directory of the machine's PAM service files.
PAM_DIR = Path("/etc/pam.d")
#: Seconds per TOTP step and digits per code (what pam_oath's users file line declares).
STEP_SECONDS = 30
DIGITS = 6
#: pam_oath's token type for TOTP with :data:`STEP_SECONDS` and :data:`DIGITS`.
TOKEN_TYPE = f"HOTP/T{STEP_SECONDS}/{DIGITS}"
_SECRET_BYTES = 20


def time_step(at: float, step: int = STEP_SECONDS) -> int:
    """The TOTP time step (counter) of the Unix time ``at``."""
    return int(at // step)


def totp(secret: bytes, at: float, *, step: int = STEP_SECONDS, digits: int = DIGITS) -> str:
    """The RFC 6238 code (HMAC-SHA1) of ``secret`` at Unix time ``at``, zero-padded."""
    digest = hmac.new(secret, struct.pack(">Q", time_step(at, step)), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    value = struct.unpack(">I", digest[offset : offset + 4])[0] & 0x7FFFFFFF
    return f"{value % 10**digits:0{digits}d}"


def users_line(user: str, secret: bytes) -> str:
    """pam_oath's users file line for ``user``: TOTP token, no password, hex secret."""
    return f"{TOKEN_TYPE}\t{user}\t-\t{secret.hex()}\n"


def _line_matches(line: str, user: str, secret: bytes) -> bool:
    fields = line.split()
    return fields[:2] == [TOKEN_TYPE, user] and fields[3:4] == [secret.hex()]


def ensure_secret(paths: Paths, user: str) -> bytes:
    """The TOTP secret (generated on first use) and a users file that holds it for ``user``.

    The users file is rewritten only when it does not hold this user and secret, because
    pam_oath keeps the last code used in it (rewriting it would allow a replay).
    """
    try:
        secret = bytes.fromhex(paths.otp_secret.read_text().strip())
    except (OSError, ValueError):
        secret = b""
    if len(secret) != _SECRET_BYTES:
        secret = secrets.token_bytes(_SECRET_BYTES)
        write_if_changed(paths.otp_secret, secret.hex() + "\n", 0o600)
    os.chmod(paths.otp_secret, 0o600)
    try:
        lines = paths.otp_users.read_text().splitlines()
    except OSError:
        lines = []
    if not any(_line_matches(line, user, secret) for line in lines):
        write_if_changed(paths.otp_users, users_line(user, secret), 0o600)
    os.chmod(paths.otp_users, 0o600)
    return secret


def read_secret(paths: Paths) -> bytes:
    """The stored TOTP secret. Raises :class:`NotRootError` for a user other than root and
    :class:`DevClusterError` when there is none (the ``otp`` site never ran)."""
    if os.geteuid() != 0:
        raise NotRootError(
            "the one-time codes of the dev cluster's otp login site come from a secret that "
            f"only root can read ({paths.otp_secret}): run this command as root"
        )
    try:
        return bytes.fromhex(paths.otp_secret.read_text().strip())
    except FileNotFoundError:
        raise DevClusterError(
            f"no one-time-code secret at {paths.otp_secret}: start the otp login site first "
            "(dagster-slurm dev-cluster up --login-sites otp)"
        ) from None
    except (OSError, ValueError) as exc:
        raise DevClusterError(f"cannot read {paths.otp_secret}: {exc}") from None


def current_code(paths: Paths, at: float | None = None) -> str:
    """The code the ``otp`` site accepts at ``at`` (default: now)."""
    return totp(read_secret(paths), time.time() if at is None else at)


def program_link(paths: Paths, sshd: str) -> Path:
    """A symbolic link named :data:`PAM_SERVICE` to ``sshd`` (created or corrected): an sshd
    without ``PAMServiceName`` started through it uses that PAM service."""
    link = paths.programs / PAM_SERVICE
    paths.programs.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.programs, 0o755)
    if not (link.is_symlink() and os.readlink(link) == sshd):
        tmp = link.with_name(f".{link.name}.tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(sshd)
        os.replace(tmp, link)
    return link
