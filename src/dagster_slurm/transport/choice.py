"""Which way a process reaches the login node: the machine's shared login, or its own.

``SSHConnectionResource.shared_login`` chooses:

* ``"auto"`` (default): a shared login to the same host, port and user
  (``dagster-slurm login``) is used whenever one is up; without one, the process logs in
  itself with paramiko, which never prompts: a site that asks for a one-time code or a
  password nobody configured fails at once with
  :class:`~dagster_slurm.errors.LoginRequired` naming the command to run. A process that
  found no shared login looks again before its next login, so that the first command after
  ``dagster-slurm login`` uses it without a restart.
* ``"required"``: only the shared login; without it every command fails at once with
  :class:`~dagster_slurm.errors.LoginRequired` (for sites where a login attempt without
  the second factor counts against the account).
* ``"off"``: always paramiko (machines without an ``ssh`` client, or to keep one
  connection per process on purpose).

When the shared login ends, the commands in flight through it fail with
:class:`~dagster_slurm.errors.LoginRequired` (they may or may not have completed). With
``"required"`` every later command fails so too until a new ``dagster-slurm login`` (same
socket path). With ``"auto"`` the next command looks again: a new shared login is used,
else the process logs in itself, which at a site that wants a one-time code fails at once
with the same advice.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from typing import Literal

from dagster_slurm.errors import LoginRequired
from dagster_slurm.transport.base import CommandResult, Stream, TransportStats
from dagster_slurm.transport.login_place import LoginPlace, ensure_private_dir
from dagster_slurm.transport.openssh import OpenSSHTransport, master_pid
from dagster_slurm.transport.ssh import SSHTransport
from dagster_slurm.transport.ssh_target import SSHOptions, SSHTarget

SharedLogin = Literal["auto", "required", "off"]

log = logging.getLogger("dagster_slurm.ssh")


class ChosenTransport:
    """A :class:`~dagster_slurm.transport.base.Transport` that runs each command through
    the shared login when there is one (see the module docstring), else through this
    process's own paramiko connection."""

    def __init__(self, target: SSHTarget, options: SSHOptions | None = None,
                 mode: SharedLogin = "auto", *, place: LoginPlace | None = None) -> None:
        self.target = target
        self.options = options or SSHOptions()
        self.mode: SharedLogin = mode
        self.stats = TransportStats()
        self.place = place or LoginPlace.of(target)
        self._own = SSHTransport(target, self.options)
        self._own.stats = self.stats
        self._shared: OpenSSHTransport | None = None
        self._lock = threading.Lock()

    @property
    def mechanism(self) -> str:
        """``"shared login"`` once commands go through the shared login, else ``"paramiko"``."""
        return "shared login" if self._shared is not None else "paramiko"

    def _current(self) -> SSHTransport | OpenSSHTransport:
        with self._lock:
            if self._shared is not None:
                if self.mode == "required" or self.place.socket.exists():
                    return self._shared
                self._shared = None  # "auto": the login ended (logout removes the socket)
            if self.mode == "off" or self._own.connected():
                return self._own
            if self.mode == "auto":
                pid = master_pid(self.place) if shutil.which("ssh") else None
                if pid is None:
                    return self._own
                ensure_private_dir(self.place.directory)  # never a socket others could plant
                log.info("%s: using the shared login of this machine (ssh master pid %s, "
                         "control socket %s)", self.target.label, pid, self.place.socket)
            self._shared = OpenSSHTransport(self.target, self.options, place=self.place,
                                            stats=self.stats)
            return self._shared

    def _lost(self, used: SSHTransport | OpenSSHTransport) -> None:
        """``used`` raised LoginRequired: in ``"auto"`` mode the next command looks again."""
        if self.mode == "auto" and used is self._shared:
            with self._lock:
                self._shared = None
            log.info("%s: the shared login is not up any more; the next command looks for "
                     "a new one, else logs in itself", self.target.label)

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = None, env: Mapping[str, str] | None = None) -> CommandResult:
        """Run ``argv``; see :class:`~dagster_slurm.transport.base.Transport`."""
        used = self._current()
        try:
            return used.run(argv, stdin=stdin, timeout=timeout, env=env)
        except LoginRequired:
            self._lost(used)
            raise

    def open_stream(self, argv: Sequence[str]) -> Stream:
        """Start ``argv`` as a long-lived stream."""
        used = self._current()
        try:
            return used.open_stream(argv)
        except LoginRequired:
            self._lost(used)
            raise

    def connected(self) -> bool:
        """Whether commands can run now without a login of this process."""
        with self._lock:
            shared = self._shared
        return shared.alive() if shared is not None else self._own.connected()

    def close(self) -> None:
        """Close this process's own connection (a shared login stays up)."""
        self._own.close()

    def drop_connection_for_test(self) -> None:
        """Cut this process's own connection abruptly, as a network failure would."""
        self._own.drop_connection_for_test()


_REGISTRY: dict[tuple[int, SSHTarget, SSHOptions, str], ChosenTransport] = {}
_REGISTRY_LOCK = threading.Lock()


def transport_for(target: SSHTarget, options: SSHOptions | None = None,
                  mode: SharedLogin = "auto") -> ChosenTransport:
    """The process-wide transport for ``target``: one per process, target and mode.

    Keyed by the process id too, so a forked child never reuses its parent's socket."""
    opts = options or SSHOptions()
    key = (os.getpid(), target, opts, mode)
    with _REGISTRY_LOCK:
        transport = _REGISTRY.get(key)
        if transport is None:
            transport = ChosenTransport(target, opts, mode)
            _REGISTRY[key] = transport
        return transport


def close_chosen_transports() -> None:
    """Close this process's own connections (shared logins stay up)."""
    with _REGISTRY_LOCK:
        items = [t for (pid, *_), t in _REGISTRY.items() if pid == os.getpid()]
    for transport in items:
        transport.close()
