"""build_snapshot (pure): what a snapshot says, and that an unknown is None."""

from __future__ import annotations

from dagster_slurm.scheduler.client import StatusSnapshot
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.scaling.snapshot import ENDED, build_snapshot, granted_gpus
from dagster_slurm.slurm.parsers import parse_squeue
from dagster_slurm.state.schema import SessionDocument

PATHS = SessionPaths.create("/cluster/ds", "run-1")
SQUEUE = """JOBID|STATE|REASON|TIME_LEFT|NODELIST|NODES|TRES_ALLOC|COMMENT|
11|RUNNING|None|1:00:00|c1|1|cpu=2,mem=4000M,node=1,billing=2|tok-h|
12|RUNNING|None|9:59|g[1-2]|2|cpu=2,mem=1G,node=2,gres/gpu:a100=2,gres/gpu:h100=1|tok-a|
13|PENDING|Resources|10:00||1|cpu=1,mem=1G,node=1,gres/gpu=1|tok-b|
31|PENDING|Priority|10:00||1|cpu=1,node=1|tok-lost|
"""


def _doc() -> SessionDocument:
    return SessionDocument.from_dict({
        "job_name": "dsr-x", "version": 7,
        "allocation": {"job_id": "11", "status": "submitted", "ready_at": 1.0,
                       "config": {"num_nodes": 1}},
        "workers": {
            "12": {"job_id": "12", "intent": "gpu", "reconciled": True, "submitted_at": 100.0,
                   "config": {"num_nodes": 2, "gpus_per_node": 2}},
            "13": {"job_id": "13", "submitted_at": 100.0, "config": {"gpus_per_node": 1}},
            "14": {"job_id": "14", "drain_deadline": 500.0},
            "9": {"job_id": "9", "released": True}},
        "worker_submissions": {
            "tok-lost": {"token": "tok-lost", "status": "submitting", "intent": "gpu"},
            "tok-a": {"token": "tok-a", "status": "submitted", "job_id": "12"}}})


def _status(certain: bool = True) -> StatusSnapshot:
    queue = {r.job_id: r for r in parse_squeue(SQUEUE)} if certain else {}
    return StatusSnapshot(1000.0, certain, queue, {}, {}, ("14",) if certain else (),
                          None if certain else "connect failure")


def test_the_snapshot_of_a_certain_observation() -> None:
    files = {PATHS.ray_nodes("12"): "g1 node-1 11\ng2 node-2 11\ng3 stale 10\n",
             PATHS.worker_state("12"): "joined\n", PATHS.ray_head: "job_id=11\n"}
    snap = build_snapshot(_doc(), _status(), files, PATHS)
    assert snap.certain and snap.observed_at == 1000.0 and snap.document_version == 7
    assert snap.head is not None and (snap.head.state, snap.head.ready) == ("RUNNING", True)
    assert snap.head.granted_gpus == 0 and snap.head_job_id == "11"
    gpu, pending, left = snap.workers()
    assert [w.slurm_job_id for w in snap.workers()] == ["12", "13", "14"]
    assert snap.workers("gpu") == (gpu,)
    assert (gpu.granted_gpus, gpu.nodes, gpu.ray_nodes, gpu.ready) == (
        3, ("g1", "g2"), {"g1": "node-1", "g2": "node-2"}, True)
    assert gpu.time_left_seconds == 599.0 and gpu.submitted_at == 100.0
    assert gpu.requested_nodes == 2 and gpu.requested_gpus_per_node == 2
    # added with add_worker_allocation: no submitted_at; pending: no grant, no time left
    assert (pending.submitted_at, pending.granted_gpus, pending.time_left_seconds) == (
        None, None, None)
    assert (pending.state, pending.reason, pending.nodes, pending.ready) == (
        "PENDING", "Resources", (), False)
    assert (left.state, left.committed, left.draining) == (ENDED, False, True)
    (lost,) = snap.submissions
    assert (lost.token, lost.found_job_id, lost.intent) == ("tok-lost", "31", "gpu")


def test_an_uncertain_observation_knows_no_state() -> None:
    snap = build_snapshot(_doc(), _status(certain=False), {}, PATHS)
    assert not snap.certain and snap.error == "connect failure"
    for w in (snap.head, *snap.workers()):
        assert w is not None
        assert (w.state, w.committed, w.granted_gpus, w.time_left_seconds, w.tres) == (
            None, None, None, None, None)
    assert snap.workers()[0].intent == "gpu" and snap.workers()[2].drain_deadline == 500.0
    assert snap.submissions[0].found_job_id is None


def test_granted_gpus_reads_the_total_or_sums_typed_entries() -> None:
    assert granted_gpus("cpu=1,gres/gpu=4,gres/gpu:a100=4") == 4
    assert granted_gpus("cpu=1,gres/gpu:a100=2,gres/gpu:h100=1") == 3
    assert granted_gpus("cpu=1,mem=1G") == 0 and granted_gpus(None) is None


def test_no_document_yet() -> None:
    snap = build_snapshot(None, _status(), {}, PATHS)
    assert snap.head is None and snap.workers() == () and snap.certain
