"""``SlurmResource.remote_base`` under the cluster user's home, as the published example
writes it (``"$HOME/dagster_runs"``, ``"~/x"``): resolved against the login user's home once
per process, when connecting; other variables and relative paths are refused, asking for
the absolute path."""

from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from dagster_slurm import SlurmResource, SSHConnectionResource
from dagster_slurm.transport.base import CommandResult


class HomeTransport:
    """A connection that answers ``printenv HOME`` with ``home`` and counts the questions."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.asked = 0

    def run(self, argv: Sequence[str], **_: object) -> CommandResult:
        assert list(argv) == ["printenv", "HOME"], argv
        self.asked += 1
        return CommandResult(" ".join(argv), 0, self.home + "\n", "", 0.0)

    def close(self) -> None:
        pass


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> HomeTransport:
    transport = HomeTransport("/home/alice")
    monkeypatch.setattr(SSHConnectionResource, "get_transport", lambda self: transport)
    return transport


def _slurm(remote_base: str | None, host: str) -> SlurmResource:
    return SlurmResource(ssh=SSHConnectionResource(host=host, user="alice"), remote_base=remote_base)


@pytest.mark.parametrize("written, resolved", [
    ("$HOME/dagster_runs", "/home/alice/dagster_runs"),
    ("${HOME}/runs/", "/home/alice/runs"),
    ("~/pipelines/deployments", "/home/alice/pipelines/deployments"),
    ("~", "/home/alice"),
    ("$HOME", "/home/alice"),
    (None, "/home/alice/dagster-slurm"),
])
def test_a_home_relative_remote_base_resolves_once_on_the_cluster(
        home: HomeTransport, written: str | None, resolved: str) -> None:
    slurm = _slurm(written, f"login-{abs(hash(written))}.invalid")
    try:
        assert slurm.remote_base == written, "the field keeps what was written"
        assert slurm.base_path() == resolved
        assert slurm.base_path() == resolved
        assert slurm.agent().install_dir.startswith(resolved + "/")
        assert home.asked == 1, "the home directory is looked up once, when connecting"
    finally:
        slurm.close()


def test_an_absolute_remote_base_asks_the_cluster_nothing(home: HomeTransport) -> None:
    slurm = _slurm("/shared/dagster", "login-absolute.invalid")
    try:
        assert slurm.base_path() == "/shared/dagster"
        assert home.asked == 0
    finally:
        slurm.close()


def test_the_published_variable_may_name_the_home_too(home: HomeTransport) -> None:
    env = {"SLURM_EDGE_NODE_HOST": "login-env.invalid", "SLURM_EDGE_NODE_USER": "alice",
           "SLURM_REMOTE_BASE": "$HOME/dagster_runs"}
    with pytest.warns(DeprecationWarning, match="SLURM_DEPLOYMENT_BASE_PATH"):
        slurm = SlurmResource.from_env(environ=env)
    try:
        assert slurm.base_path() == "/home/alice/dagster_runs"
    finally:
        slurm.close()


@pytest.mark.parametrize("written, problem", [
    ("dagster_runs", "must be an absolute path on the cluster, or start with $HOME/ or ~/"),
    ("~bob/runs", "no other variable or ~user is expanded"),
    ("$HOMEDIR/runs", "no other variable or ~user is expanded"),
    ("$SCRATCH/runs", "no other variable or ~user is expanded"),
    ("/scratch/$USER/runs", "variables are not expanded here, only a leading $HOME/ or ~/"),
    ("$HOME/$USER", "variables are not expanded here"),
])
def test_other_relative_or_variable_paths_are_refused_saying_what_to_write(
        written: str, problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _slurm(written, "login.invalid")
    assert f"remote_base={written!r}" in str(caught.value)
    assert problem in str(caught.value)


@pytest.mark.parametrize("base", ["/tmp/x", "/tmp", "/var/tmp/runs", "/dev/shm/a/../b",
                                  "/run/user/1000/ds"])
def test_a_base_path_below_a_node_local_directory_is_named(base: str) -> None:
    from dagster_slurm.resources.slurm import node_local_reason

    reason = node_local_reason(base)
    assert reason is not None and "each login node has for itself" in reason


@pytest.mark.parametrize("base", ["/home/me/dagster-slurm", "/tmpfs/x", "/scratch/tmp/x"])
def test_a_shared_base_path_passes(base: str) -> None:
    from dagster_slurm.resources.slurm import node_local_reason

    assert node_local_reason(base) is None
