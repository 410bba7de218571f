"""How this process's own paramiko login authenticates: never a prompt.

paramiko's default login, when the server asks for a second factor after the key, prints
the server's prompt to standard output and reads the answer from standard input: in a
Dagster run worker that is a terminal nobody watches, or a hang. :class:`NoPromptAuth`
replaces it. It offers what is configured (the key, the ssh-agent's keys, the password),
answers a keyboard-interactive question only when it asks for the configured password,
and when the server wants more (a one-time code, a password nobody configured) it raises
:class:`~dagster_slurm.errors.LoginRequired` at once, naming the host and the
``dagster-slurm login`` command that establishes a shared login a person authenticates.
"""

from __future__ import annotations

from collections.abc import Callable

import paramiko
from paramiko.auth_strategy import AuthStrategy

from dagster_slurm.errors import LoginRequired
from dagster_slurm.transport.login_place import login_command
from dagster_slurm.transport.ssh_target import SSHTarget

#: What a person can answer that a process cannot.
SECOND_FACTOR_METHODS = frozenset({"keyboard-interactive", "password"})


def needs_person(target: SSHTarget, what: str) -> LoginRequired:
    """The error for a login that needs someone to type something (``what`` says what)."""
    return LoginRequired(
        f"SSH login to {target.label} needs a person: {what}. A process running unattended "
        f"does not prompt. Log in once on this machine with: {login_command(target)} "
        "(every process of this user then uses that login)"
    )


class NoPromptAuth(AuthStrategy):
    """paramiko authentication for ``target`` with ``key`` that never prompts (see the module
    docstring). Raises :class:`paramiko.AuthenticationException` (as paramiko's own login
    does) when the server refuses everything offered, and :class:`LoginRequired` when it
    asks for a second factor that is not configured."""

    def __init__(self, target: SSHTarget, key: paramiko.PKey | None) -> None:
        super().__init__(ssh_config=paramiko.SSHConfig())
        self.target = target
        self.key = key

    def _attempts(self, transport: paramiko.Transport) -> list[tuple[str, Callable[[], list]]]:
        user = self.target.user
        attempts: list[tuple[str, Callable[[], list]]] = []
        if self.key is not None:
            key = self.key
            attempts.append(("key", lambda: transport.auth_publickey(user, key)))
        if self.target.allow_agent and not self.target.password:
            for agent_key in paramiko.Agent().get_keys():
                attempts.append(("agent key", lambda k=agent_key: transport.auth_publickey(user, k)))
        if self.target.password:
            attempts.append(("password", lambda: self._password(transport)))
        return attempts

    def _password(self, transport: paramiko.Transport) -> list:
        password = self.target.password
        assert password is not None
        try:
            return transport.auth_password(self.target.user, password, fallback=False)
        except paramiko.BadAuthenticationType as exc:
            if "keyboard-interactive" not in exc.allowed_types:
                raise
        return self._interactive(transport)

    def _interactive(self, transport: paramiko.Transport) -> list:
        """keyboard-interactive, answering only questions for the configured password."""
        password = self.target.password or ""
        unanswered: list[str] = []

        def handler(title: str, instructions: str, prompts: list) -> list[str]:
            answers = []
            for text, echo in prompts:
                if not echo and "password" in text.lower() and password:
                    answers.append(password)
                else:
                    unanswered.append(text.strip())
                    answers.append("")
            return answers

        try:
            return transport.auth_interactive(self.target.user, handler)
        except paramiko.AuthenticationException:
            if unanswered:
                raise needs_person(self.target, "the server asks "
                                   + ", ".join(repr(t) for t in unanswered)) from None
            raise

    def authenticate(self, transport: paramiko.Transport) -> list:  # type: ignore[override]
        """Try each configured way in turn; see the class docstring."""
        last: paramiko.AuthenticationException | None = None
        for kind, attempt in self._attempts(transport):
            try:
                remaining = attempt()
            except paramiko.AuthenticationException as exc:
                last = exc
                continue
            if transport.is_authenticated():
                return []
            return self._second_factor(transport, kind, list(remaining or []))
        if last is None:
            raise paramiko.SSHException("No authentication methods available")
        allowed = set(getattr(last, "allowed_types", None) or [])
        if allowed and allowed <= SECOND_FACTOR_METHODS and not self.target.password:
            raise needs_person(self.target, "the server accepts only "
                               + ", ".join(sorted(allowed)) + " (a password or one-time code)")
        raise last

    def _second_factor(self, transport: paramiko.Transport, kind: str,
                       remaining: list[str]) -> list:
        """The server accepted ``kind`` and asks for one of ``remaining`` next."""
        if self.target.password and SECOND_FACTOR_METHODS & set(remaining):
            result = self._password(transport)
            if transport.is_authenticated():
                return result
        raise needs_person(self.target, f"after the {kind} the server asks for "
                           + " or ".join(remaining) + " (a second factor such as a one-time code)")
