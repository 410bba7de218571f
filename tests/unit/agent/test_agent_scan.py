"""scan: documents at a fixed depth below roots, read in one operation, with a sibling;
and a job_status poll of every job of the user from the shared answer, in the same request."""

from __future__ import annotations

import json
from pathlib import Path

from agent_support import write_script

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.ops import ScanSpec, SharedSqueue, job_status_op, scan_op


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    sessions, runs = tmp_path / "sessions", tmp_path / "runs"
    for sid in ("a", "b"):
        (sessions / sid).mkdir(parents=True)
        (sessions / sid / "allocation.json").write_text(json.dumps({"version": 2, "sid": sid}))
    (sessions / "c").mkdir()  # no document: nothing listed
    (sessions / "a" / "deeper").mkdir()
    (sessions / "a" / "deeper" / "allocation.json").write_text("{}")  # wrong depth
    inv = runs / "r1" / "step" / "inv1"
    inv.mkdir(parents=True)
    (inv / "job.json").write_text(json.dumps({"job": {"job_id": "7"}}))
    (inv / "heartbeat").write_text("123.0 host 1 4\n")
    bare = runs / "r1" / "step" / "inv2"
    bare.mkdir(parents=True)
    (bare / "job.json").write_text("{not json")
    return sessions, runs


def test_documents_at_their_depth_with_siblings_and_unreadable_ones_reported(
        client: AgentClient, tmp_path: Path) -> None:
    sessions, runs = _tree(tmp_path)
    result = client.run(scan_op([ScanSpec(str(sessions), "allocation.json", 2),
                                 ScanSpec(str(runs), "job.json", 4, sibling="heartbeat"),
                                 ScanSpec(str(tmp_path / "missing"), "x.json", 2)]))
    paths = [e.path for e in result.entries]
    assert paths == [str(sessions / "a" / "allocation.json"),
                     str(sessions / "b" / "allocation.json"),
                     str(runs / "r1" / "step" / "inv1" / "job.json"),
                     str(runs / "r1" / "step" / "inv2" / "job.json")]
    a, _, job, broken = result.entries
    assert a.doc == {"version": 2, "sid": "a"} and a.version == 2 and a.sibling is None
    assert job.doc == {"job": {"job_id": "7"}} and job.sibling is not None
    assert job.sibling.data == "123.0 host 1 4\n"
    assert broken.doc is None and broken.error and "JSON" in broken.error
    assert broken.sibling is not None and not broken.sibling.exists


def test_every_job_of_the_user_comes_with_the_scan_in_one_request(
        client: AgentClient, bindir: Path, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    write_script(bindir, "squeue", f"""\
        echo "squeue $*" >> {calls}
        echo '11|dsr-a|RUNNING'
        echo '12|dsl-b|PENDING'
        """)
    sessions, runs = _tree(tmp_path)
    share = SharedSqueue(str(tmp_path / "status" / "squeue-{uid}.json"), ("squeue", "--me"),
                         30.0, all_jobs=True)
    with client.batch() as batch:
        scan = batch.add(scan_op([ScanSpec(str(sessions), "allocation.json", 2)]))
        jobs = batch.add(job_status_op(["squeue", "--me"], [], shared=share))
    assert len(scan.result().entries) == 2
    status = jobs.result()
    assert status.squeue.stdout.splitlines() == ["11|dsr-a|RUNNING", "12|dsl-b|PENDING"]
    assert status.absent_ids == () and status.squeue.ran
    again = client.run(job_status_op(["squeue", "--me"], [], shared=share))
    assert not again.squeue.ran and calls.read_text().splitlines() == ["squeue --me"]
