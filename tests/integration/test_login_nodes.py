"""Several login nodes behind one name (``dev-cluster up --login-nodes 2``).

Each process is aimed at ``login1`` or ``login2`` itself (``DevClusterInfo.env_at``): the
nodes have their own hostname, ``/tmp`` and PID namespace and share ``/home``, where the
library keeps everything that must be shared (session documents, locks, heartbeats, the
agent). The tests need a cluster with two login nodes and are skipped (failed under
``CI=true``) on one with a single login node.
"""

import multiprocessing
import os
import re
import sys
import time
import uuid
from pathlib import Path

import pytest
from compute_support import slurm_resource, wait_until
from session_support import active_jobs

from dagster_slurm import SlurmResource, SlurmRunAllocationConfig
from dagster_slurm.agent import mkdir_op
from dagster_slurm.errors import LockTimeout
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.session.session import RunSession
from dagster_slurm.state.store import AgentStateStore

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
NODES = ("login1", "login2")
IDLE = "idle: listing requests every 2 s until woken"

#: Takes the lock with a short lease, says so, and sleeps (until it is killed).
HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from dagster_slurm_agent.lock import acquire
acquire(sys.argv[2], timeout=10, purpose="holder on " + sys.argv[4], lease=float(sys.argv[3]))
print("locked", flush=True)
time.sleep(600)
"""
LEASE = 3.0


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    if len(slurm_cluster.login_nodes) < 2:
        message = ("the dev cluster runs one login node; these tests need two "
                   "(dagster-slurm dev-cluster up --login-nodes 2)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return slurm_cluster


def _slurm_at(cluster, node: str) -> SlurmResource:
    return slurm_resource(cluster.env_at(node))


def _hostname(slurm: SlurmResource) -> str:
    result = slurm.ssh.get_transport().run(["hostname"])
    assert result.ok, result.stderr
    return result.stdout.strip()


def test_the_name_reaches_each_login_node_in_turn(cluster):
    seen = []
    for _ in range(4):
        slurm = slurm_resource(cluster.env())
        try:
            seen.append(_hostname(slurm))
        finally:
            slurm.close()
    assert set(seen) == set(NODES), seen
    for node in NODES:
        slurm = _slurm_at(cluster, node)
        try:
            assert _hostname(slurm) == node
        finally:
            slurm.close()


def _agent_op_at_barrier(env: dict, path: str, barrier, results) -> None:  # noqa: ANN001
    slurm = slurm_resource(env)
    try:
        host = _hostname(slurm)
        barrier.wait()
        slurm.agent().run(mkdir_op(path))
        results.put((host, "ok"))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(("?", f"error: {exc!r}"))
    finally:
        slurm.close()


def test_the_agent_installed_on_one_login_node_is_found_on_the_other(cluster):
    base = f"{cluster.deployment_base_path}/test-agents/{uuid.uuid4().hex[:12]}"
    envs = {node: {**cluster.env_at(node), "SLURM_DEPLOYMENT_BASE_PATH": base} for node in NODES}
    login1, login2 = (slurm_resource(envs[node]) for node in NODES)
    try:
        login1.agent().run(mkdir_op(f"{base}/from-login1"))
        program = login1.agent().program_path
        inode = ["stat", "-c", "%i", program]
        before = login2.ssh.get_transport().run(inode)
        assert before.ok, before.stderr
        login2.agent().run(mkdir_op(f"{base}/from-login2"))
        assert login2.ssh.get_transport().run(inode).stdout == before.stdout  # not reinstalled
    finally:
        login1.close()
        login2.close()
    # eight first requests at once on a base path without the agent: four per login node
    # (pids repeat across the nodes' PID namespaces; the installers must not collide)
    fresh = f"{base}/fresh"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_agent_op_at_barrier,
                         args=({**envs[NODES[i % 2]], "SLURM_DEPLOYMENT_BASE_PATH": fresh},
                               f"{fresh}/made-{i}", barrier, results))
             for i in range(8)]
    for proc in procs:
        proc.start()
    try:
        answers = [results.get(timeout=120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(60)
    assert sorted(answers) == sorted((node, "ok") for node in NODES * 4), answers
    listing = Path(fresh) / ".dagster-slurm"
    assert [p.name for p in listing.iterdir()] == [Path(program).name]


def _ensure_at_barrier(env: dict, run_id: str, barrier, results) -> None:  # noqa: ANN001
    os.environ.update(env)
    sys.path.insert(0, str(HERE))
    slurm = slurm_resource(env)
    session = RunSession(
        slurm, run_id, SlurmRunAllocationConfig(heartbeat_timeout=120, heartbeat_interval=5),
        BashLauncher(), activation=lambda: None,
    )
    host = _hostname(slurm)
    barrier.wait()
    try:
        results.put((host, session.ensure().job_id))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put((host, f"error: {exc!r}"))
    finally:
        session.close(cancel=False)
        slurm.close()


def test_eight_processes_on_two_login_nodes_start_one_allocation(cluster):
    run_id = str(uuid.uuid4())
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    envs = [cluster.env_at(NODES[i % 2]) for i in range(8)]
    procs = [ctx.Process(target=_ensure_at_barrier, args=(env, run_id, barrier, results))
             for env in envs]
    for proc in procs:
        proc.start()
    try:
        answers = [results.get(timeout=180) for _ in procs]
    finally:
        for proc in procs:
            proc.join(60)
    hosts = sorted(host for host, _ in answers)
    job_ids = {job_id for _, job_id in answers}
    assert hosts == sorted(NODES * 4), answers
    assert len(job_ids) == 1 and not next(iter(job_ids)).startswith("error"), answers
    env = cluster.env()
    try:
        assert [row[0] for row in active_jobs(env, f"dsr-{run_id}")] == list(job_ids)
    finally:
        RunSession(slurm_resource(env), run_id, SlurmRunAllocationConfig(), BashLauncher(),
                   activation=lambda: None).close(cancel=True)


def _start_holder(slurm: SlurmResource, lock: str, node: str) -> int:
    """A process on ``node`` that takes ``lock`` with a lease of LEASE s; its pid there."""
    agent = slurm.agent()
    agent.install()
    result = slurm.ssh.get_transport().run(
        ["sh", "-c", 'python3 -c "$1" "$2" "$3" "$4" "$5" > "$3.out" 2>&1 & echo $!; '
         'for i in $(seq 100); do grep -q locked "$3.out" 2>/dev/null && exit 0; sleep 0.05; '
         'done; exit 1',
         "sh", HOLDER, agent.program_path, lock, str(LEASE), node],
    )
    assert result.ok, result.stderr
    return int(result.stdout.split()[0])


def test_a_lock_holder_killed_on_login1_is_taken_over_from_login2_after_its_lease(cluster):
    login1, login2 = (_slurm_at(cluster, node) for node in NODES)
    try:
        session_dir = f"{login2.base_path()}/test-state/{uuid.uuid4().hex[:12]}"
        login2.agent().run(mkdir_op(session_dir))
        store = AgentStateStore(login2.agent(), session_dir, initial={"schema_version": 1},
                                lock_timeout=0.5)
        store.transact([{"op": "add", "path": "/before", "value": True}])  # agent installed
        pid = _start_holder(login1, store.lock_path, "login1")
        assert login1.ssh.get_transport().run(["kill", "-KILL", str(pid)]).ok
        killed = time.monotonic()
        # the holder is dead, but login2 cannot see login1's processes: only the lease counts
        with pytest.raises(LockTimeout) as refused:
            store.transact([{"op": "add", "path": "/too_early", "value": True}])
        assert "login1" in str(refused.value) and "lease" in str(refused.value)
        store.lock_timeout = 10
        result = store.transact([{"op": "add", "path": "/after_lease", "value": True}])
        took = time.monotonic() - killed
        assert result.ok and result.doc["after_lease"] is True and "too_early" not in result.doc
        assert any("lease expired" in w and "host login1" in w for w in result.warnings), \
            result.warnings
        print(f"takeover from login2 {took:.2f} s after the SIGKILL on login1 (lease {LEASE} s)")
    finally:
        login1.close()
        login2.close()


def _step(session: RunSession, log: Path, name: str, wake: bool = True) -> tuple[float, str]:
    """Run ``true`` as step ``name`` once the server is idle again (``wake``: with the
    wake-up the library writes); (seconds until it ended, how the server found it)."""
    wait_until(lambda: log.read_text().rfind(IDLE) > log.read_text().rfind("started step"), 30,
               f"the server to be idle before {name}, in {log}")
    allocation = session.ensure()
    began = time.monotonic()
    handle = allocation.launch(allocation.invocation(name), "#!/bin/bash\ntrue\n", name=name,
                               wake=wake)
    result = allocation.wait(handle)
    took = time.monotonic() - began
    assert result.exit_code == 0, result
    found = re.search(rf"started step {name} \(request \w+, found ([a-z -]+)\)", log.read_text())
    assert found, log.read_text()
    return took, found.group(1)


def test_a_step_from_login2_starts_in_the_allocation_woken_from_login1(cluster):
    run_id = str(uuid.uuid4())
    config = SlurmRunAllocationConfig(heartbeat_timeout=120, heartbeat_interval=5)
    login1, login2 = (_slurm_at(cluster, node) for node in NODES)
    first = RunSession(login1, run_id, config, BashLauncher(), activation=lambda: None)
    second = RunSession(login2, run_id, config, BashLauncher(), activation=lambda: None)
    try:
        allocation = first.allocation
        log = Path(first.paths.output_of(allocation.job_id))
        wait_until(lambda: log.exists() and IDLE in log.read_text(), 30, f"idle line in {log}")
        from_login1 = _step(first, log, "from_login1")
        assert from_login1[1] == "on a wake-up"
        assert second.ensure().job_id == allocation.job_id
        from_login2 = _step(second, log, "from_login2")
        # as at a site, where the wake FIFO carries nothing to another host: the listing
        listed = _step(second, log, "listed_from_login2", wake=False)
        assert listed[1] == "by the listing"
        print(f"idle server, step 'true' from login1: {from_login1[0]:.2f} s ({from_login1[1]}),"
              f" from login2: {from_login2[0]:.2f} s ({from_login2[1]}), from login2 without"
              f" wake-up: {listed[0]:.2f} s ({listed[1]})")
    finally:
        second.close(cancel=False)
        first.close(cancel=True)
        login1.close()
        login2.close()
