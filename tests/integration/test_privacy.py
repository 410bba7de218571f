"""What other users of the cluster cannot see: the files of someone else's jobs.

Job scripts and Pipes context files carry ``extra_env`` values (and the Ray password);
they are checked as the dev cluster's second unprivileged account (``dslurm2``) sees
them: ``runuser -u dslurm2`` from this process, which runs as root on the host whose
``/home`` the cluster's nodes share. The Ray test checks, on the head node itself, that
the dashboard listens on the node's own address only and that the password is on no
command line of the job's own (srun, bash) processes.
"""

import os
import stat
import subprocess
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import compute as compute_resource
from compute_support import slurm_resource, write_payload
from session_support import session_compute

from dagster_slurm.compute.resource import ComputeResource
from dagster_slurm.devcluster.layout import OTHER_USER
from dagster_slurm.jobs.paths import safe_name
from dagster_slurm.launchers.ray import RayLauncher

pytestmark = [pytest.mark.integration]

PAYLOAD = """
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"ok": True})
"""


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def as_other_user(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", OTHER_USER, "--", *argv], capture_output=True, text=True, check=False
    )


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_private(files: list[Path], new_dirs: list[Path], secret: str) -> None:
    """``files`` 0600 and unreadable by the other user; ``new_dirs`` 0700, and the
    topmost one the other user can look at shows 0700 to it."""
    assert files, "no files to check"
    assert any(secret in f.read_text() for f in files), "the secret is in none of the files"
    for path in files:
        assert mode_of(path) == 0o600, (path, oct(mode_of(path)))
        denied = as_other_user("cat", str(path))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (path, denied)
        assert secret not in denied.stdout
    for directory in new_dirs:
        assert mode_of(directory) == 0o700, (directory, oct(mode_of(directory)))
    top = min(new_dirs, key=lambda d: len(d.parts))
    while mode_of(top.parent) == 0o700:  # a parent already private: that is what it sees
        top = top.parent
    seen = as_other_user("stat", "-c", "%a", str(top))
    assert (seen.returncode, seen.stdout.strip()) == (0, "700"), (top, seen)
    listing = as_other_user("ls", str(top))
    assert listing.returncode != 0 and "Permission denied" in listing.stderr, listing


def test_other_user_cannot_read_an_asset_jobs_script_or_context(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD)
    secret = f"s3cret-{uuid.uuid4().hex}"
    base = Path(env["SLURM_DEPLOYMENT_BASE_PATH"])
    checked: list[str] = []

    @dg.asset(name="private_asset")
    def _asset(context: dg.AssetExecutionContext, compute: ComputeResource):
        invocation = compute.run(context=context, payload_path=payload, defer_cleanup=True,
                                 extra_env={"DSLURM_PRIVATE_VALUE": secret})
        run_dir = base / "runs" / safe_name(context.run.run_id, 64)
        (job_dir,) = (run_dir / "private_asset").iterdir()
        files = [job_dir / "dagster_slurm_job.sh", job_dir / "pipes_context.json",
                 job_dir / "ok.py"]
        assert_private(files, [run_dir, run_dir / "private_asset", job_dir], secret)
        compute.cleanup_deferred_run_dir(context)
        checked.append(str(job_dir))
        yield from invocation.get_results()

    result = dg.materialize([_asset], resources={"compute": compute_resource(env)})
    assert result.success and checked


def test_other_user_cannot_read_a_run_sessions_scripts_or_context(env, tmp_path):
    payload = write_payload(tmp_path, "ok.py", PAYLOAD)
    secret = f"s3cret-{uuid.uuid4().hex}"
    checked: list[str] = []

    @dg.asset(name="private_step")
    def _asset(context: dg.AssetExecutionContext, compute: ComputeResource):
        invocation = compute.run(context=context, payload_path=payload, defer_cleanup=True,
                                 extra_env={"DSLURM_PRIVATE_VALUE": secret})
        session = compute.get_run_allocation_session(context)
        session_dir = Path(session.paths.session_dir)
        step_dir = Path(session.paths.steps_dir(session.allocation.job_id)) / "private_step"
        (job_dir,) = step_dir.iterdir()
        (submit_dir,) = (session_dir / "submit").iterdir()
        files = [job_dir / "dagster_slurm_step.sh", job_dir / "pipes_context.json",
                 job_dir / "ok.py", submit_dir / "allocation.sh", submit_dir / "step_server.sh",
                 session_dir / "heartbeat"]
        assert_private(files, [session_dir, submit_dir, step_dir, job_dir], secret)
        # the step's script has the secret; the allocation's scripts are private all the same
        assert secret in (job_dir / "dagster_slurm_step.sh").read_text()
        compute.cleanup_deferred_run_dir(context)
        checked.append(str(job_dir))
        yield from invocation.get_results()

    result = dg.materialize([_asset], resources={"compute": session_compute("bash", env)})
    assert result.success and checked


RAY_PAYLOAD = """
import os, socket
import ray
from dagster_pipes import open_dagster_pipes

def accepts(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return True
    except OSError:
        return False

with open_dagster_pipes() as pipes:
    context = ray.init(address="auto", logging_level="ERROR")
    host, port = context.dashboard_url.rsplit(":", 1)
    password = pipes.extras["password"]
    carriers = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\\0")
        except OSError:
            continue
        if any(password.encode() in arg for arg in argv):
            carriers.append([os.path.basename(a.decode()) for a in argv[:3]])
    pipes.report_asset_materialization(metadata={
        "dashboard_host": host,
        "head_address": socket.gethostbyname(socket.gethostname()),
        "on_own_address": accepts(host, int(port)),
        "on_loopback": accepts("127.0.0.1", int(port)),
        "carriers": carriers,
    })
"""


@pytest.mark.slow
def test_ray_dashboard_on_the_nodes_address_and_password_off_job_command_lines(env, tmp_path):
    payload = write_payload(tmp_path, "ray_private.py", RAY_PAYLOAD)
    password = f"pw{uuid.uuid4().hex[:12]}"
    kwargs: dict[str, object] = {}
    if os.environ.get("DAGSTER_SLURM_TEST_RAY_ENV_PATH"):
        kwargs["pre_deployed_env_path"] = os.environ["DAGSTER_SLURM_TEST_RAY_ENV_PATH"]
    else:
        kwargs["env_packages"] = ["dagster-pipes", "ray[default,data]==2.60.0"]
    compute = ComputeResource(
        mode="slurm", slurm=slurm_resource(env, mem="2500M", cpus=2),
        default_launcher=RayLauncher(redis_password=password), **kwargs,
    )

    @dg.asset(name="ray_private")
    def _asset(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=payload,
                               extras={"password": password}).get_results()

    result = dg.materialize([_asset], resources={"compute": compute})
    assert result.success
    (event,) = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["dashboard_host"] == meta["head_address"]
    assert str(meta["head_address"]).startswith("127.0.1."), meta
    assert meta["on_own_address"] is True
    assert meta["on_loopback"] is False, "the dashboard listens on every interface"
    carriers = meta["carriers"]
    assert carriers, "the probe found no process with the password (ray start has it)"
    job_side = [argv for argv in carriers if argv and argv[0] in ("srun", "bash", "sh")]
    assert job_side == [], carriers
