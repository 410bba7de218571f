"""What the user may set about the cluster environment, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from dagster_slurm.environment.config import EnvironmentConfig, default_cache_dir


def test_defaults_pack_the_current_environment_for_the_detected_platform():
    config = EnvironmentConfig()
    assert config.pre_deployed_env_path is None
    assert config.auto_detect_platform is True
    assert config.env_packages is None
    assert config.env_packer == "auto"
    assert config.cache_dir() == default_cache_dir()


def test_cache_dir_default_honours_xdg_and_expands_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "dagster-slurm"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert EnvironmentConfig(env_cache_dir="~/c").cache_dir() == tmp_path / "c"


@pytest.mark.parametrize("value", ["relative/env", "~/env", "/ok\n/evil"])
def test_pre_deployed_path_must_be_absolute_on_the_cluster(value):
    with pytest.raises(ValidationError, match="pre_deployed_env_path"):
        EnvironmentConfig(pre_deployed_env_path=value)


def test_pre_deployed_path_is_normalised():
    assert EnvironmentConfig(pre_deployed_env_path="/opt/env/").pre_deployed_env_path == "/opt/env"


def test_env_packages_must_be_requirement_strings():
    assert EnvironmentConfig(env_packages=["numpy==2.1.0", "dagster-pipes"]).env_packages == [
        "numpy==2.1.0",
        "dagster-pipes",
    ]
    with pytest.raises(ValidationError, match="env_packages"):
        EnvironmentConfig(env_packages=["numpy==="])


def test_contradictory_choices_are_refused():
    with pytest.raises(ValidationError, match="pre_deployed_env_path"):
        EnvironmentConfig(pre_deployed_env_path="/opt/env", env_packages=["numpy"])
    with pytest.raises(ValidationError, match="env_packer"):
        EnvironmentConfig(env_packer="pixi", env_packages=["numpy"])


def test_identity_tells_configurations_apart():
    assert EnvironmentConfig().identity() == EnvironmentConfig().identity()
    assert EnvironmentConfig().identity() != EnvironmentConfig(env_packages=["six"]).identity()
