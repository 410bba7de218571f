"""The paramiko login never prompts: what it offers, and when it needs a person (pure,
with a stand-in for paramiko's Transport)."""

from __future__ import annotations

import paramiko
import pytest

from dagster_slurm.errors import LoginRequired
from dagster_slurm.transport.ssh_auth import NoPromptAuth
from dagster_slurm.transport.ssh_target import SSHTarget


class _Server:
    """Answers like paramiko's Transport for a server with ``methods`` required in turn."""

    def __init__(self, *steps: str, prompts: tuple[tuple[str, bool], ...] = ()) -> None:
        self.steps = list(steps)
        self.prompts = prompts
        self.calls: list[str] = []
        self.answers: list[list[str]] = []
        self.done = False

    def is_authenticated(self) -> bool:
        return self.done

    def _accept(self, method: str) -> list[str]:
        if not self.steps or self.steps[0] != method:
            exc = paramiko.BadAuthenticationType("Bad authentication type", self.steps[:1])
            raise exc
        self.steps.pop(0)
        self.done = not self.steps
        return [] if self.done else self.steps[:1]

    def auth_publickey(self, user, key):
        self.calls.append("publickey")
        return self._accept("publickey")

    def auth_password(self, user, password, fallback=True):
        self.calls.append("password")
        assert fallback is False, "paramiko's fallback would send the password to any prompt"
        return self._accept("password")

    def auth_interactive(self, user, handler):
        self.calls.append("keyboard-interactive")
        self.answers.append(handler("", "", list(self.prompts)))
        if any(not text.lower().startswith("password") for text, _ in self.prompts):
            raise paramiko.AuthenticationException("Authentication failed.")
        return self._accept("keyboard-interactive")


KEY = object()


def _target(**kw) -> SSHTarget:
    return SSHTarget("login", 22, "alice", allow_agent=False, **kw)


def test_a_key_the_server_accepts_is_enough():
    server = _Server("publickey")
    assert NoPromptAuth(_target(key_path="/k"), KEY).authenticate(server) == []
    assert server.calls == ["publickey"]


def test_a_second_factor_after_the_key_needs_a_person_and_no_prompt_is_answered():
    server = _Server("publickey", "keyboard-interactive", prompts=(("One-time code: ", False),))
    with pytest.raises(LoginRequired) as caught:
        NoPromptAuth(_target(key_path="/k"), KEY).authenticate(server)
    message = str(caught.value)
    assert "keyboard-interactive" in message and "dagster-slurm login --host login" in message
    assert server.calls == ["publickey"], "nothing was sent for the second factor"


def test_a_server_that_takes_only_codes_needs_a_person():
    server = _Server("keyboard-interactive", prompts=(("Verification code: ", False),))
    with pytest.raises(LoginRequired, match="accepts only keyboard-interactive"):
        NoPromptAuth(_target(key_path="/k"), KEY).authenticate(server)


def test_the_configured_password_answers_only_a_password_question():
    server = _Server("keyboard-interactive", prompts=(("Password: ", False),))
    NoPromptAuth(_target(password="pw"), None).authenticate(server)
    assert server.calls == ["password", "keyboard-interactive"] and server.answers == [["pw"]]
    asked = _Server("keyboard-interactive",
                    prompts=(("Password: ", False), ("One-time code: ", False)))
    with pytest.raises(LoginRequired, match="'One-time code:'"):
        NoPromptAuth(_target(password="pw"), None).authenticate(asked)
    assert asked.answers == [["pw", ""]], "the code question got no password"


def test_a_site_taking_only_passwords_needs_a_person_when_none_is_configured():
    with pytest.raises(LoginRequired, match="accepts only password"):
        NoPromptAuth(_target(key_path="/k"), KEY).authenticate(_Server("password"))


class _RefusingKeys(_Server):
    def auth_publickey(self, user, key):
        self.calls.append("publickey")
        raise paramiko.BadAuthenticationType("Authentication failed.", ["publickey"])


def test_a_refused_key_is_paramikos_authentication_error_for_the_usual_message():
    with pytest.raises(paramiko.AuthenticationException):
        NoPromptAuth(_target(key_path="/k"), KEY).authenticate(_RefusingKeys("publickey"))
