"""What the Ray job script keeps private: the password off srun's and bash's command
lines, the dashboard on the node's own address, the temp dir for the job's user only."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray_stubs import ENV_PAYLOAD, StubCluster, kill_stub_processes, options

#: The port range of this module's stub Ray heads (see ray_stubs).
PORTS = (30500, 30999)


@pytest.fixture
def cluster(tmp_path: Path):
    stub = StubCluster.create(tmp_path, ports=PORTS)
    yield stub
    kill_stub_processes(stub)


def test_password_reaches_ray_start_but_not_the_step_command_lines(cluster: StubCluster) -> None:
    launcher = cluster.launcher(redis_password="pw-7f3a91", include_dashboard=False)
    result = cluster.run(cluster.write(launcher, cluster.plan(ENV_PAYLOAD)))
    assert result.returncode == 0, result.stderr
    assert options(cluster.ray_argv("c1"))["redis-password"] == "pw-7f3a91"
    assert options(cluster.ray_argv("c2"))["redis-password"] == "pw-7f3a91"
    step_argv = (cluster.log / "srun.fullargv").read_bytes().split(b"\0")
    assert len([arg for arg in step_argv if arg.startswith(b"--nodelist=")]) == 2
    assert not [arg for arg in step_argv if b"pw-7f3a91" in arg]


def test_dashboard_listens_on_the_heads_own_address_unless_configured(
    cluster: StubCluster,
) -> None:
    result = cluster.run(cluster.write(cluster.launcher(), cluster.plan(ENV_PAYLOAD)))
    assert result.returncode == 0, result.stderr
    head = options(cluster.ray_argv("c1"))
    assert head["dashboard-host"] == head["node-ip-address"] == "127.0.1.1"
    (cluster.log / "ray.c1.argv").unlink()
    (cluster.log / "ray.c2.argv").unlink()
    everywhere = cluster.launcher(dashboard_host="0.0.0.0")
    result = cluster.run(cluster.write(everywhere, cluster.plan(ENV_PAYLOAD)))
    assert result.returncode == 0, result.stderr
    assert options(cluster.ray_argv("c1"))["dashboard-host"] == "0.0.0.0"


def test_dashboard_host_refuses_what_is_not_an_address() -> None:
    from pydantic import ValidationError

    from dagster_slurm.launchers.ray import RayLauncher

    with pytest.raises(ValidationError, match=r"dashboard_host='0\.0\.0\.0; id'"):
        RayLauncher(dashboard_host="0.0.0.0; id")


def test_ray_temp_dir_is_created_for_the_jobs_user_only(cluster: StubCluster) -> None:
    temp_dir = f"/tmp/dsr-test-{cluster.job_id}"
    payload = ("bash", "-c", f'stat -c "mode=%a" {temp_dir}')
    cluster.bin.joinpath("stat").symlink_to("/usr/bin/stat")
    launcher = cluster.launcher(temp_dir=temp_dir)
    result = cluster.run(cluster.write(launcher, cluster.plan(payload)))
    assert result.returncode == 0, result.stderr
    assert "mode=700" in result.stdout
