"""Accounting that lags behind a finished job: the metadata never says PENDING or RUNNING.

slurmctld sends job records to slurmdbd asynchronously; when slurmdbd is away it queues
them and sends them some seconds after slurmdbd is back. In that time ``sacct`` shows the
state slurmdbd last heard of (here RUNNING) for a job ``squeue`` already lists as
COMPLETED. These tests stop the cluster's real slurmdbd around a job's end and check the
asset's metadata: COMPLETED read from ``sacct`` once it caught up, or COMPLETED as seen by
``squeue`` (with ``dagster_slurm/state_source`` saying so and the accounting figures null)
when it did not within the library's deadline. With slurmdbd away for a whole run (both
scopes), every step reports the state ``squeue`` or its status file gave, nothing waits for
accounting, and the run is warned once. slurmdbd is started again in a ``finally``
(through the dev cluster, whose launcher closes inherited file descriptors, so the
restarted daemon does not hold the integration-test lock) and waited for until ``sacct``
answers.
"""

import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
from compute_support import (
    PAYLOAD_OK,
    compute,
    materialize_one,
    run_logs,
    step_failure,
    write_payload,
)

from dagster_slurm import ComputeResource
from dagster_slurm.compute import slurm_runner
from dagster_slurm.slurm.states import JobState

pytestmark = pytest.mark.integration


#: The library's accounting deadline in the tests where accounting stays away past it: the
#: same reads until the deadline, without waiting the default 15 s.
SHORT_DEADLINE = 3.0


def final(state: str) -> bool:
    return JobState.parse(state).terminal


#: Waits for a release file (path in $DSLURM_RELEASE) so the test decides when it ends.
PAYLOAD_RELEASED = """
import os, time
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    deadline = time.monotonic() + 240
    while not os.path.exists(os.environ["DSLURM_RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    pipes.report_asset_materialization(metadata={"released": os.path.exists(os.environ["DSLURM_RELEASE"])})
"""


class Slurmdbd:
    """The dev cluster's slurmdbd, stopped and started by pid file and ``DevCluster.up``."""

    def __init__(self, cluster_info) -> None:
        from dagster_slurm.devcluster import DevCluster

        self.info = cluster_info
        self.cluster = DevCluster(state_dir=cluster_info.state_dir)
        self.pid_file = Path(cluster_info.state_dir) / "run" / "slurmdbd.pid"
        self.env = {"SLURM_CONF": str(cluster_info.slurm_conf), "PATH": "/usr/bin:/bin"}
        self.program = cluster_info.slurm_command

    def pid(self) -> int:
        return int(self.pid_file.read_text().split()[0])

    def stop(self) -> None:
        pid = self.pid()
        os.kill(pid, signal.SIGTERM)
        until(lambda: not Path(f"/proc/{pid}").exists(), 30, f"slurmdbd {pid} to exit")

    def start(self) -> None:
        """Start it again (a no-op while it runs) and wait until sacct answers."""
        self.cluster.up()
        until(lambda: self.sacct("1")[0] == 0, 60, "sacct to answer after slurmdbd started")

    def sacct(self, job_id: str) -> tuple[int, str, str]:
        """``(rc, state of the allocation line or '', last stderr line)``."""
        proc = subprocess.run(
            [self.program("sacct"), "-n", "-P", "-X", "-j", job_id, "-o", "State"],
            capture_output=True, text=True, env=self.env, timeout=60, check=False,
        )
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return proc.returncode, proc.stdout.strip(), lines[-1] if lines else ""

    def holds_the_test_lock(self) -> bool:
        """Whether slurmdbd has the tests' lock file open; a descriptor it closes while the
        list is read (a connection ending) is skipped."""
        for fd in Path(f"/proc/{self.pid()}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except FileNotFoundError:
                continue
            if "dslurm-itest.lock" in target:
                return True
        return False


def until(condition, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def squeue_state(dbd: Slurmdbd, name_suffix: str) -> tuple[str, str] | None:
    """``(job id, state)`` of the job whose name ends with ``name_suffix``, if listed."""
    out = subprocess.run(
        [dbd.program("squeue"), "-h", "-t", "all", "-o", "%i|%j|%T"], capture_output=True, text=True,
        env=dbd.env, timeout=60, check=True,
    ).stdout
    for line in out.splitlines():
        job_id, name, state = line.split("|")
        if name.endswith(name_suffix):
            return job_id, state
    return None


@pytest.fixture
def slurmdbd(slurm_cluster):
    dbd = Slurmdbd(slurm_cluster)
    dbd.start()
    try:
        yield dbd
    finally:
        dbd.start()
        assert not dbd.holds_the_test_lock(), "the restarted slurmdbd holds the test lock"


def run_while_accounting_lags(slurm_cluster, slurmdbd: Slurmdbd, tmp_path: Path):
    """Materialize an asset whose job ends while slurmdbd is away; slurmdbd is back right
    after. Returns the materialization's metadata, the run's log messages and what the
    test itself saw of accounting (``lag``: seconds from the job's end in squeue until
    sacct showed a final state; ``stale``: the states sacct gave in between)."""
    env = slurm_cluster.env()
    asset = f"lagging_{uuid.uuid4().hex[:8]}"
    release = Path(slurm_cluster.deployment_base_path) / f"release-{asset}"
    payload = write_payload(tmp_path, "released.py", PAYLOAD_RELEASED)
    seen: dict[str, object] = {"stale": []}

    def drive() -> None:
        # The job is running and accounting knows it; slurmdbd goes away; the job ends
        # (its end record cannot be sent); slurmdbd comes back, but slurmctld sends the
        # queued records only some seconds later: sacct still says RUNNING meanwhile.
        job_id, _ = until(lambda: squeue_state(slurmdbd, f"-{asset}"), 240, "the job in squeue")
        seen["job_id"] = job_id
        until(lambda: slurmdbd.sacct(job_id)[1] == "RUNNING", 120, "sacct to show it RUNNING")
        slurmdbd.stop()
        release.write_text("go\n")
        until(lambda: (squeue_state(slurmdbd, f"-{asset}") or ("", ""))[1] == "COMPLETED", 120,
              "squeue to show the job COMPLETED")
        ended = time.monotonic()
        seen["while_down"] = slurmdbd.sacct(job_id)
        slurmdbd.start()
        seen["restarted_after"] = time.monotonic() - ended

        def caught_up() -> bool:
            rc, state, _ = slurmdbd.sacct(job_id)
            if rc == 0 and not final(state):
                seen["stale"].append(state)
            return rc == 0 and final(state)

        until(caught_up, 120, "sacct to show the job's final state")
        seen["lag"] = time.monotonic() - ended

    driver = threading.Thread(target=lambda: _record_failure(drive, seen, release), daemon=True)
    driver.start()
    try:
        result = materialize_one(payload, compute(env), raise_on_error=False, name=asset,
                                 extra_env={"DSLURM_RELEASE": str(release)})
        driver.join(180)
    finally:
        release.write_text("go\n")  # the payload must end even when the driver failed
        driver.join(60)
        release.unlink(missing_ok=True)
    assert "error" not in seen, seen.get("error")
    print(f"\naccounting lag: job {seen['job_id']}: slurmdbd back {seen['restarted_after']:.1f} s "
          f"after the job's end, sacct final {seen['lag']:.1f} s after it; sacct said "
          f"{sorted(set(seen['stale']))} in between; while down: {seen['while_down']}")
    # The premise: when the job had ended, accounting did not know it.
    assert seen["while_down"][0] != 0 or not final(seen["while_down"][1])
    assert result.success
    (event,) = result.get_asset_materialization_events()
    meta = {key: value.value for key, value in event.materialization.metadata.items()}
    assert meta["released"] is True
    return meta, run_logs(result), seen


def test_accounting_that_lags_is_read_until_it_shows_the_final_state(
    slurm_cluster, slurmdbd, tmp_path, monkeypatch
):
    # A deadline longer than slurmctld's delay in sending the queued records.
    monkeypatch.setattr(slurm_runner, "ACCOUNTING_DEADLINE", 60.0)
    meta, logs, seen = run_while_accounting_lags(slurm_cluster, slurmdbd, tmp_path)
    assert seen["stale"], "accounting caught up at once: the lag was not reproduced"
    assert meta["dagster_slurm/state"] == "COMPLETED", meta
    assert meta["dagster_slurm/state_source"] == "sacct", meta
    assert meta["dagster_slurm/elapsed_seconds"] and meta["dagster_slurm/exit_code"] == 0
    assert not any("showed no final state" in (m or "") for m in logs)


def test_accounting_that_lags_past_the_deadline_is_never_reported_running(
    slurm_cluster, slurmdbd, tmp_path, monkeypatch
):
    monkeypatch.setattr(slurm_runner, "ACCOUNTING_DEADLINE", SHORT_DEADLINE)
    meta, logs, _ = run_while_accounting_lags(slurm_cluster, slurmdbd, tmp_path)
    assert meta["dagster_slurm/state"] == "COMPLETED", meta
    assert meta["dagster_slurm/exit_code"] == 0
    warned = any("showed no final state" in (m or "") for m in logs)
    if meta["dagster_slurm/state_source"] == "sacct":  # accounting was quicker this time
        assert meta["dagster_slurm/elapsed_seconds"] is not None and not warned
    else:
        assert meta["dagster_slurm/state_source"] == "squeue", meta
        assert meta["dagster_slurm/elapsed_seconds"] is None and warned


def _three_assets(payload: str):
    """Three assets of one run, each one Slurm job (or one step of the run's allocation)."""
    assets = []
    for name in ("first", "second", "third"):
        @dg.asset(name=name)
        def _asset(context: dg.AssetExecutionContext, compute: ComputeResource):
            yield from compute.run(context=context, payload_path=payload,
                                   extras={"answer": 42}).get_results()
        assets.append(_asset)
    return assets


def _whole_run_without_accounting(resource: ComputeResource, payload: str):
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(_three_assets(payload), resources={"compute": resource},
                            raise_on_error=False, instance=instance)
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    metas = [{key: value.value for key, value in event.materialization.metadata.items()}
             for event in result.get_asset_materialization_events()]
    return result, logs, metas


def test_accounting_away_for_a_whole_run_gives_squeue_states_one_warning_and_no_wait(
    slurm_cluster, slurmdbd, tmp_path
):
    # The library's own deadline (15 s) stays: accounting away since before the run's jobs
    # is not waited for, which the warning's "after 1 read(s) over 0.0 s" says.
    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    slurmdbd.stop()
    result, logs, metas = _whole_run_without_accounting(compute(slurm_cluster.env()), payload)
    assert result.success
    assert len(metas) == 3
    for meta in metas:
        assert meta["rows"] == 42
        assert meta["dagster_slurm/state"] == "COMPLETED"
        assert meta["dagster_slurm/state_source"] == "squeue"
        assert meta["dagster_slurm/exit_code"] == 0 and meta["dagster_slurm/nodes"]
        for key in ("elapsed_seconds", "cpu_efficiency", "max_rss_mb"):
            assert meta[f"dagster_slurm/{key}"] is None, key
    warnings = [m for m in logs if "showed no final state" in (m or "")]
    assert len(warnings) == 1, warnings
    assert "sacct failed" in warnings[0] and "once per run" in warnings[0]
    assert "after 1 read(s) over 0.0 s" in warnings[0]


def test_a_run_scope_run_while_accounting_is_away_reports_status_file_states_once_warned(
    slurm_cluster, slurmdbd, tmp_path
):
    from session_support import session_compute

    payload = write_payload(tmp_path, "ok.py", PAYLOAD_OK)
    slurmdbd.stop()
    result, logs, metas = _whole_run_without_accounting(
        session_compute("bash", slurm_cluster.env()), payload)
    assert result.success, step_failure(result)
    assert len(metas) == 3
    for meta in metas:
        assert meta["dagster_slurm/state"] == "COMPLETED"
        assert meta["dagster_slurm/state_source"] == "status_file"
        assert "." in meta["dagster_slurm/job_id"] and meta["dagster_slurm/exit_code"] == 0
        for key in ("elapsed_seconds", "cpu_efficiency", "max_rss_mb"):
            assert meta[f"dagster_slurm/{key}"] is None, key
    warnings = [m for m in logs if "showed no final state" in (m or "")]
    assert len(warnings) == 1, warnings
    assert "sacct failed" in warnings[0] and "once per run" in warnings[0]
    assert "after 1 read(s) over 0.0 s" in warnings[0]


def _record_failure(function, seen: dict, release: Path) -> None:
    try:
        function()
    except BaseException as exc:  # noqa: BLE001 - reported by the test's assertion
        seen["error"] = f"{type(exc).__name__}: {exc}"
        release.write_text("go\n")  # let the payload end
