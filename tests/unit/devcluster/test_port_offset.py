"""A second development cluster beside the first: every port moves by the offset, the
offset is remembered by the state directory, and bad offsets are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagster_slurm.devcluster.config import render_slurm_conf, render_slurmdbd_conf
from dagster_slurm.devcluster.errors import DevClusterError
from dagster_slurm.devcluster.layout import (
    DEFAULT_SSH_PORT,
    NODES,
    PORT_OFFSET_ENV,
    PORTS,
    record_settings,
    resolve_settings,
)


def test_every_port_moves_by_the_offset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DAGSTER_SLURM_DEV_SSH_PORT", raising=False)
    settings = resolve_settings(state_dir=tmp_path, port_offset=1000)
    assert settings.ssh_port == DEFAULT_SSH_PORT + 1000
    assert {name: settings.port(name) for name in PORTS} == {
        name: port + 1000 for name, port in PORTS.items()}
    conf = render_slurm_conf(settings)
    assert f"SlurmctldPort={PORTS['slurmctld'] + 1000}" in conf
    for node in NODES:
        assert f"Port={PORTS[node.daemon] + 1000}" in conf
    assert f"DbdPort={PORTS['slurmdbd'] + 1000}" in render_slurmdbd_conf(settings, "pw")
    assert settings.deployment_base_path.name == "dagster-slurm-1000"


def test_the_offset_is_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_OFFSET_ENV, "2000")
    record_settings(resolve_settings(state_dir=tmp_path))
    monkeypatch.delenv(PORT_OFFSET_ENV)
    assert resolve_settings(state_dir=tmp_path).port_offset == 2000
    assert resolve_settings(state_dir=tmp_path / "other").port_offset == 0


@pytest.mark.parametrize("text", ["ten", "-5", "90000"])
def test_bad_offsets_are_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(PORT_OFFSET_ENV, text)
    with pytest.raises(DevClusterError, match=PORT_OFFSET_ENV):
        resolve_settings(state_dir=tmp_path)
