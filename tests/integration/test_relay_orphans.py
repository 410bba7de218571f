"""A relayed run's supervisor on the dev cluster: orphan judgement, heartbeat, extensions.

What is shown, with real Slurm and real Dagster runs:

* ``reconcile_orphaned_slurm_runs`` with a real instance leaves a STARTED run alone whose
  first allocation was drained and cancelled while its successor RUNS (not yet promoted),
  and again once the successor was promoted, for longer than its ``heartbeat_timeout``
  without a run event: the supervisor's heartbeat alone keeps it. Once the supervising
  process is SIGKILLed, the same run is recovered: its allocations (the promoted one and a
  PENDING successor) are cancelled, the session is closed and the run marked failed.
* The heartbeat file's content keeps changing while an asset waits for a PENDING
  successor (it needs the nodes its predecessor holds), and no heartbeat thread is left
  after the run's teardown, nor after a teardown that keeps the allocation.
* A session subclass's allocation subclass (``make_allocation``) serves the promoted
  successor's steps, and its ``clone_allocation_config`` carries a directive over to the
  successor; a session that finds its allocation ended while the successor runs refuses to
  submit a new one and names the successor.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from compute_support import slurm_resource, squeue_state, wait_until
from session_support import session_compute

from dagster_slurm import ComputeResource, SlurmRunAllocationConfig, reconcile_orphaned_slurm_runs
from dagster_slurm.devcluster.info import slurm_command
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.session.core.allocation import SlurmAllocation
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.orphans.runs import quiet_for
from dagster_slurm.session.session import RunSession
from dagster_slurm.slurm.states import JobState

pytestmark = [pytest.mark.integration]

HERE = Path(__file__).parent
#: The reconciliation's limit: seconds without heartbeat and run events.
ORPHAN_LIMIT = 5.0
HEARTBEAT_THREAD = "dagster-slurm-heartbeat-"


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def _scancel(env: Mapping[str, str], *args: str) -> None:
    subprocess.run([slurm_command(env, "scancel"), *args], check=False,
                   env={"SLURM_CONF": env["SLURM_CONF"], "PATH": "/usr/bin:/bin"})


def _ended(env: Mapping[str, str], job_id: str) -> bool:
    return squeue_state(env, job_id) in ("", "CANCELLED", "COMPLETED", "COMPLETING")


def _heartbeat_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(HEARTBEAT_THREAD)]


# -- the orphan judgement of a relayed run ------------------------------------------------------
RELAY_RUN = """
    import json, os, time
    from pathlib import Path
    import dagster as dg
    from session_support import session_compute
    from dagster_slurm import ComputeResource, SlurmRunAllocationConfig
    from dagster_slurm.slurm.states import JobState

    marks = Path(os.environ["RELAY_MARKS"])

    def tell(**facts):
        path = marks / "facts.json"
        known = json.loads(path.read_text()) if path.exists() else {}
        (marks / "facts.tmp").write_text(json.dumps({**known, **facts}))
        (marks / "facts.tmp").replace(path)

    def wait_for(name, timeout):
        deadline = time.monotonic() + timeout
        while not (marks / name).exists():
            assert time.monotonic() < deadline, f"no {name} from the test"
            time.sleep(0.2)

    @dg.asset
    def relay(context: dg.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        first = session.allocation
        successor = session.submit_successor()
        deadline = time.monotonic() + 120
        while successor.state() is not JobState.RUNNING:
            assert time.monotonic() < deadline, "the successor never ran"
            time.sleep(0.5)
        first.request_drain()
        tell(run_id=context.run.run_id, job_name=session.job_name, first=first.job_id,
             successor=successor.job_id, document=session.paths.document,
             heartbeat=session.paths.heartbeat, phase="drained")
        wait_for("promote", 300)  # the test cancels the drained first allocation meanwhile
        promoted = session.promote_successor()
        later = session.submit_successor(
            SlurmRunAllocationConfig(extra_sbatch_directives=["--begin=now+1hour"]))
        tell(promoted=promoted.job_id, pending=later.job_id, phase="promoted")
        wait_for("never", 3600)  # the supervisor stays silent until it is killed

    instance = dg.DagsterInstance.local_temp(tempdir=os.environ["DSLURM_TEST_HOME"])
    compute = session_compute("bash", heartbeat_interval=1.0, heartbeat_timeout=60.0)
    dg.materialize([relay], resources={"compute": compute}, instance=instance,
                   raise_on_error=False)
"""


def _facts(marks: Path) -> dict[str, Any]:
    path = marks / "facts.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _left_alone(instance: dg.DagsterInstance, slurm: Any, run_id: str, heartbeat: Path) -> int:
    """Reconcile every second for twice the limit, until the run has been quiet (no event)
    for twice the limit and the heartbeat was seen with five different contents; every
    reconciliation must leave it alone. The number of heartbeat contents seen meanwhile
    (on a loaded machine a reconciliation can take seconds, so the number of rounds, not
    the time, decides how many contents are seen)."""
    contents: set[str] = set()
    start = time.monotonic()
    deadline = start + 90
    while True:
        assert reconcile_orphaned_slurm_runs(instance, slurm, heartbeat_timeout=ORPHAN_LIMIT,
                                             prune_closed_after=None) == []
        contents.add(heartbeat.read_text())
        quiet = quiet_for(instance, run_id)
        if (quiet is not None and quiet > 2 * ORPHAN_LIMIT and len(contents) >= 5
                and time.monotonic() - start > 2 * ORPHAN_LIMIT):
            return len(contents)
        assert time.monotonic() < deadline, \
            f"quiet {quiet} s, {len(contents)} heartbeat contents after 90 s"
        time.sleep(1.0)


@pytest.mark.slow
def test_a_relayed_run_is_kept_while_its_supervisor_beats_and_recovered_once_it_died(
        env, tmp_path):
    home, marks = tmp_path / "home", tmp_path / "marks"
    home.mkdir()
    marks.mkdir()
    script = tmp_path / "relay_run.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
                      + textwrap.dedent(RELAY_RUN))
    proc = subprocess.Popen([sys.executable, str(script)], env={
        **os.environ, **env, "DSLURM_TEST_HOME": str(home), "RELAY_MARKS": str(marks)})
    slurm = slurm_resource(env)
    facts: dict[str, Any] = {}
    try:
        facts = wait_until(lambda: _facts(marks).get("phase") == "drained" and _facts(marks),
                           240, "the first allocation to drain with its successor RUNNING")
        instance = dg.DagsterInstance.local_temp(tempdir=str(home))
        run_id = facts["run_id"]
        heartbeat = Path(facts["heartbeat"])
        # The drained first allocation ends (its walltime, an operator): the successor runs.
        _scancel(env, facts["first"])
        wait_until(lambda: _ended(env, facts["first"]), 30, "the first allocation to end")
        assert squeue_state(env, facts["successor"]) == "RUNNING"
        assert _left_alone(instance, slurm, run_id, heartbeat) >= 5
        assert squeue_state(env, facts["successor"]) == "RUNNING"
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.STARTED

        (marks / "promote").touch()
        facts = wait_until(lambda: _facts(marks).get("phase") == "promoted" and _facts(marks),
                           120, "the promotion")
        assert facts["promoted"] == facts["successor"]
        assert _left_alone(instance, slurm, run_id, heartbeat) >= 5
        assert squeue_state(env, facts["promoted"]) == "RUNNING"
        assert squeue_state(env, facts["pending"]) == "PENDING"

        # The supervisor dies: no heartbeat, no event; the run is recovered.
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        reports = wait_until(lambda: reconcile_orphaned_slurm_runs(
            instance, slurm, heartbeat_timeout=ORPHAN_LIMIT, prune_closed_after=None),
            60, "the reconciliation to judge the run orphaned", interval=1.0)
        assert [(r.scope, r.run_id, r.job_name) for r in reports] == \
            [("run", run_id, facts["job_name"])], reports
        assert set(reports[0].job_ids) == {facts["promoted"], facts["pending"]}
        assert reports[0].run_marked_failed and "no supervisor heartbeat" in reports[0].reason
        wait_until(lambda: _ended(env, facts["promoted"]) and _ended(env, facts["pending"]),
                   30, "both allocations to be cancelled")
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
        assert json.loads(Path(facts["document"]).read_text()).get("closed_at") is not None
    finally:
        if proc.poll() is None:
            proc.kill()
        if facts.get("job_name"):
            _scancel(env, f"--name={facts['job_name']}")
        slurm.close()


# -- the heartbeat while the caller waits for a queued successor -------------------------------
def _waiting_asset(shared: dict[str, Any], queued: threading.Event) -> dg.AssetsDefinition:
    """An asset that queues a successor and waits, through the session's public API, until
    it runs; then promotes it and runs a step in it (its job id is the asset's value)."""

    @dg.asset
    def waits(context: dg.AssetExecutionContext, compute: ComputeResource) -> str:
        session = compute.get_run_allocation_session(context)
        first = session.allocation
        successor = session.submit_successor()  # needs both nodes, which first holds
        shared.update(heartbeat=session.paths.heartbeat, first=first.job_id,
                      successor=successor.job_id, job_name=session.job_name)
        queued.set()
        deadline = time.monotonic() + 180
        while successor.state() is not JobState.RUNNING:
            assert time.monotonic() < deadline, "the successor never ran"
            time.sleep(0.5)
        session.promote_successor()
        step = session.execute_in_session(["bash", "-c", 'echo "$SLURM_JOB_ID"'], name="after")
        return step.stdout_tail.strip()

    return waits


@pytest.mark.slow
def test_the_heartbeat_beats_while_an_asset_waits_for_a_pending_successor(env):
    shared: dict[str, Any] = {}
    queued, outcome = threading.Event(), {}
    waits = _waiting_asset(shared, queued)
    compute = session_compute("bash", env, num_nodes=2, cpus_per_task=2, heartbeat_interval=1.0,
                              heartbeat_timeout=60.0)

    def materialize() -> None:
        try:
            outcome["result"] = dg.materialize([waits], resources={"compute": compute},
                                               instance=dg.DagsterInstance.ephemeral())
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc
        finally:
            queued.set()

    runner = threading.Thread(target=materialize)
    runner.start()
    try:
        assert queued.wait(240) and "error" not in outcome, outcome
        heartbeat = Path(shared["heartbeat"])
        wait_until(lambda: squeue_state(env, shared["successor"]) == "PENDING", 30,
                   "the successor to be queued")
        contents: list[str] = []

        def advanced() -> bool:
            assert squeue_state(env, shared["successor"]) == "PENDING"
            content = heartbeat.read_text()
            if not contents or contents[-1] != content:
                contents.append(content)
            return len(contents) >= 5

        wait_until(advanced, 30, "the heartbeat to change while the successor is PENDING",
                   interval=0.3)
        stamps = [int(c.split()[-1]) for c in contents]
        assert stamps == sorted(stamps), contents
        assert _heartbeat_threads(), "no heartbeat thread while the asset waits"
        _scancel(env, shared["first"])  # the predecessor's end frees the nodes
        runner.join(240)
        assert not runner.is_alive() and "error" not in outcome, outcome
        result = outcome["result"]
        assert result.success
        assert result.output_for_node("waits") == shared["successor"]
        assert _heartbeat_threads() == []  # teardown stopped it
        wait_until(lambda: _ended(env, shared["successor"]), 30,
                   "teardown to cancel the promoted successor")
    finally:
        if runner.is_alive():
            _scancel(env, f"--name={shared.get('job_name', 'none')}")
            runner.join(60)
        if shared.get("job_name"):
            _scancel(env, f"--name={shared['job_name']}")


def test_a_teardown_that_keeps_the_allocation_stops_the_heartbeat(env):
    slurm = slurm_resource(env)
    config = SlurmRunAllocationConfig(heartbeat_interval=1.0, heartbeat_timeout=60.0,
                                      allow_short_heartbeat_timeout=True)
    session = RunSession(slurm, str(uuid.uuid4()), config, BashLauncher(),
                         activation=lambda: None)
    try:
        allocation = session.allocation
        assert _heartbeat_threads()
        session.close(cancel=False)  # kept for the run's other steps
        assert _heartbeat_threads() == []
        assert squeue_state(env, allocation.job_id) == "RUNNING"
    finally:
        _scancel(env, f"--name={session.job_name}")
        slurm.close()


# -- a subclass's allocations serve the promoted successor -------------------------------------
class SiteAllocation(SlurmAllocation):
    """Every step of this allocation sees the site name of its session."""

    site = ""

    def execute(self, command: Any, *, env: Mapping[str, str] | None = None,
                **kwargs: Any) -> Any:
        return super().execute(command, env={**(env or {}), "SITE_NAME": self.site}, **kwargs)


class SiteSession(RunSession):
    """Its allocations are SiteAllocations; a successor keeps the ``--nice`` of the current."""

    site = "hpc-a"

    def make_allocation(self, job_id: str, nodes: tuple[str, ...], values: Mapping[str, Any],
                         config: Mapping[str, Any] | None = None) -> SlurmAllocation:
        base = super().make_allocation(job_id, nodes, values, config)
        allocation = SiteAllocation(
            base.scheduler, base.paths, base.job_name, base.job_id, nodes=base.nodes,
            head=base.head, ray_address=base.ray_address, drain_signal=base.drain_signal,
            poll_interval=base.poll_interval, clock=base.clock, sleep=base.sleep)
        allocation.site = self.site
        return allocation

    def clone_allocation_config(self, current: Mapping[str, Any],
                                 given: SlurmRunAllocationConfig) -> SlurmRunAllocationConfig:
        merged = super().clone_allocation_config(current, given)
        nice = [d for d in current.get("extra_sbatch_directives", []) if d.startswith("--nice")]
        return merged.model_copy(
            update={"extra_sbatch_directives": [*merged.extra_sbatch_directives, *nice]})


def _nice(env: Mapping[str, str], job_id: str) -> str:
    return subprocess.run([slurm_command(env, "squeue"), "-h", "-j", job_id, "-o", "%y"], capture_output=True,
                          text=True, env={"SLURM_CONF": env["SLURM_CONF"]}).stdout.strip()


def test_a_subclass_allocation_serves_the_promoted_successor(env):
    slurm = slurm_resource(env)
    run_id = str(uuid.uuid4())
    config = SlurmRunAllocationConfig(heartbeat_interval=1.0, heartbeat_timeout=60.0,
                                      allow_short_heartbeat_timeout=True,
                                      extra_sbatch_directives=["--nice=10"])

    def build(cls: type[RunSession]) -> RunSession:
        return cls(slurm, run_id, config, BashLauncher(), activation=lambda: None)

    session = build(SiteSession)
    try:
        first = session.allocation
        assert isinstance(first, SiteAllocation)
        successor = session.submit_successor(SlurmRunAllocationConfig(time_limit="00:08:00"))
        assert successor.config.extra_sbatch_directives == ["--nice=10"]
        assert _nice(env, successor.job_id) == "10"
        wait_until(lambda: squeue_state(env, successor.job_id) == "RUNNING", 60,
                   "the successor to run")
        _scancel(env, first.job_id)
        wait_until(lambda: _ended(env, first.job_id), 30, "the first allocation to end")
        # the user's shared squeue answer may list it as running for status_max_age more
        wait_until(lambda: session.io.poll_ready(session.job_name, first.job_id,
                                                 with_status=True).status.ended_state(
            first.job_id), 30, "the shared squeue answer to show the first allocation ended")
        # another process of the run that needs the allocation now is told to promote
        other = build(RunSession)
        with pytest.raises(SessionError, match=rf"outstanding successor, job "
                                               rf"{successor.job_id} \(RUNNING\).*"
                                               r"session\.promote_successor\(\)"):
            other.ensure()
        other.close(cancel=False)
        assert squeue_state(env, successor.job_id) == "RUNNING"  # nothing new submitted

        promoted = session.promote_successor()
        assert isinstance(promoted, SiteAllocation) and promoted.job_id == successor.job_id
        assert session.allocation is promoted and session.slurm is slurm
        step = session.execute_in_session(
            ["bash", "-c", 'echo "$SITE_NAME $SLURM_JOB_ID"'], name="site")
        assert step.stdout_tail.strip() == f"hpc-a {successor.job_id}"
    finally:
        session.close(cancel=True)
        slurm.close()
