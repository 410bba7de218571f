"""Short-lived SSH user certificates signed by the cluster's own certificate authority.

The ``cert`` login site trusts only certificates of the user CA whose key pair lives in
the root-only ``ssh`` directory of the state directory, issued to the submitter (the
certificate's principal is the user name). :func:`issue_certificate` signs the public
half of a key with ``ssh-keygen -s``, the way a site's signing service would, and writes
the certificate atomically (``<key>-cert.pub`` unless told otherwise), so that a client
reading it meanwhile sees the old or the new file, never a partial one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dagster_slurm.devcluster.errors import DevClusterError, NotRootError
from dagster_slurm.devcluster.layout import Settings
from dagster_slurm.devcluster.processes import daemon_env
from dagster_slurm.transport.certificates import CERTIFICATE_SUFFIX, Validity, parse_validity

#: Validity window (ssh-keygen ``-V``) of a certificate issued already expired, for tests.
EXPIRED_WINDOW = "-2h:-1h"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+)([smhdw]?)")


def parse_duration(text: str) -> int:
    """Seconds in ``5m``, ``90s``, ``1h30m``, ``2d`` (a bare number counts seconds).

    Raises :class:`ValueError` for anything else, or for zero."""
    compact = text.strip().lower()
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"{text!r} is not a duration such as 90s, 5m, 1h30m or 2d")
    seconds = sum(int(number) * _UNITS[unit or "s"] for number, unit in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r}: a certificate must be valid for some time")
    return seconds


def validity_window(valid_seconds: int | None) -> str:
    """ssh-keygen's ``-V`` argument: from now for ``valid_seconds``; None: already expired."""
    return EXPIRED_WINDOW if valid_seconds is None else f"+{valid_seconds}s"


@dataclass(frozen=True)
class IssuedCertificate:
    """A certificate written to ``path``, its ``identity`` (``-I``), ``principal`` (the
    user it logs in as) and ``validity`` as ``ssh-keygen -L`` reports it."""

    path: Path
    identity: str
    principal: str
    validity: Validity


def public_key_of(key: Path) -> Path:
    """The public half of ``key`` (``key`` itself when it already ends in ``.pub``)."""
    return key if key.name.endswith(".pub") else key.with_name(key.name + ".pub")


def default_output(key: Path) -> Path:
    """Where OpenSSH and the library look for the certificate of ``key``: ``<key>-cert.pub``."""
    stem = key.name.removesuffix(".pub")
    return key.with_name(stem + CERTIFICATE_SUFFIX)


def _checked(argv: list[str], what: str) -> str:
    proc = subprocess.run(
        argv, env={**daemon_env(), "TZ": "UTC"}, capture_output=True, text=True,
        timeout=60, check=False,
    )
    if proc.returncode != 0:
        raise DevClusterError(f"{what} failed ({' '.join(argv)}): {proc.stderr.strip()}")
    return proc.stdout


def issue_certificate(
    settings: Settings,
    key: Path | None = None,
    out: Path | None = None,
    valid_seconds: int | None = 300,
) -> IssuedCertificate:
    """Sign the public half of ``key`` (default: the cluster's certificate key) with the
    user CA for the submitter, valid from now for ``valid_seconds`` (None: a certificate
    that expired an hour ago); write it to ``out`` (default ``<key>-cert.pub``), owned
    like the key. Needs root (the CA key is root's) and a CA (``up --login-sites cert``).
    """
    if os.geteuid() != 0:
        raise NotRootError("issuing certificates needs the cluster's CA key, which only "
                           "root can read: run this command as root")
    paths = settings.paths
    if not paths.user_ca_key.exists():
        raise DevClusterError(
            f"no user CA at {paths.user_ca_key}: start the cert login site first "
            "(dagster-slurm dev-cluster up --login-sites cert)"
        )
    key = Path(key or paths.cert_client_key).expanduser().absolute()
    public = public_key_of(key)
    if not public.is_file():
        raise DevClusterError(f"no public key {public} to certify (ssh-keygen -y -f KEY > "
                              "KEY.pub writes it from the private key)")
    target = Path(out).expanduser().absolute() if out else default_output(key)
    if not target.parent.is_dir():
        raise DevClusterError(f"cannot write {target}: {target.parent} is not a directory")
    identity = f"{settings.user}@dagster-slurm-dev-cluster"
    owner = (key if key.exists() else public).stat()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".issue-cert-") as work:
        staged = Path(work) / "key.pub"
        shutil.copyfile(public, staged)
        _checked(
            ["ssh-keygen", "-q", "-s", str(paths.user_ca_key), "-I", identity,
             "-n", settings.user, "-V", validity_window(valid_seconds),
             "-z", str(int(time.time())), str(staged)],
            "signing the certificate",
        )
        signed = Path(work) / ("key" + CERTIFICATE_SUFFIX)
        os.chown(signed, owner.st_uid, owner.st_gid)
        os.chmod(signed, 0o644)
        os.replace(signed, target)
    listing = _checked(["ssh-keygen", "-L", "-f", str(target)], "reading the certificate")
    return IssuedCertificate(target, identity, settings.user, parse_validity(str(target), listing))
