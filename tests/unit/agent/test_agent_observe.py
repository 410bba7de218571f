"""observe_session: the document, one squeue, sacct for the rest and every known job's files."""

from __future__ import annotations

import json
from pathlib import Path

from agent_support import write_script

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.ops import observe_session_op
from dagster_slurm.agent.remote.observe import known_job_ids

HEADER = "JOBID|STATE|COMMENT|"



def _session(tmp_path: Path) -> Path:
    session = tmp_path / "s"
    (session / "jobs" / "11").mkdir(parents=True)
    (session / "jobs" / "12").mkdir(parents=True)
    (session / "jobs" / "12" / "ray_nodes").write_text("g1 abc 11\n")
    (session / "ray_head").write_text("job_id=11\n")
    doc = {"schema_version": 1, "version": 3, "job_name": "dsr-x",
           "allocation": {"job_id": "11", "status": "submitted"},
           "successor": None,
           "workers": {"12": {"job_id": "12"}, "13": {"job_id": "13"},
                       "9": {"job_id": "9", "released": True}}}
    (session / "allocation.json").write_text(json.dumps(doc))
    return session


def test_the_known_jobs_are_head_successor_and_unreleased_workers() -> None:
    doc = {"allocation": {"job_id": "11"}, "successor": {"job_id": None},
           "workers": {"12": {}, "9": {"released": True}}}
    assert known_job_ids(doc) == ["11", "12"]
    assert known_job_ids(None) == [] and known_job_ids({"workers": []}) == []


def test_one_squeue_one_sacct_for_jobs_it_no_longer_lists_and_the_files(
        client: AgentClient, bindir: Path, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    write_script(bindir, "squeue", f"""\
        echo "squeue $*" >> {calls}
        echo '{HEADER}'
        echo '11|RUNNING|tok-a|'
        echo '12|PENDING|tok|b|'
        """)
    write_script(bindir, "sacct", f"""\
        echo "sacct $*" >> {calls}
        echo '13|COMPLETED'
        """)
    session = _session(tmp_path)
    result = client.run(observe_session_op(
        str(session / "allocation.json"), ["squeue", "--name=dsr-x"], sacct_argv=["sacct"],
        jobs_dir=str(session / "jobs"), job_files=["ray_nodes", "state"],
        files=[str(session / "ray_head")]))
    assert result.doc is not None and result.version == 3
    assert result.known_ids == ("11", "12", "13")
    assert result.status.absent_ids == ("13",) and result.status.sacct_ids == ("13",)
    assert calls.read_text().splitlines() == ["squeue --name=dsr-x", "sacct --jobs=13"]
    files = result.files
    assert files[str(session / "jobs" / "12" / "ray_nodes")].data == "g1 abc 11\n"
    assert not files[str(session / "jobs" / "11" / "state")].exists
    assert files[str(session / "ray_head")].data == "job_id=11\n"
    assert len(files) == 3 * 2 + 1


def test_a_failing_squeue_concludes_nothing(client: AgentClient, bindir: Path,
                                            tmp_path: Path) -> None:
    write_script(bindir, "squeue", "echo 'slurm_load_jobs error: Unable to contact' >&2; exit 1\n")
    write_script(bindir, "sacct", f"touch {tmp_path / 'sacct-ran'}\n")
    session = _session(tmp_path)
    result = client.run(observe_session_op(str(session / "allocation.json"), ["squeue"],
                                           sacct_argv=["sacct"]))
    assert result.status.squeue.rc == 1 and result.status.absent_ids is None
    assert result.status.sacct is None and not (tmp_path / "sacct-ran").exists()
    assert result.doc is not None  # the bookkeeping is still read


def test_no_document_yet(client: AgentClient, bindir: Path, tmp_path: Path) -> None:
    write_script(bindir, "squeue", f"echo '{HEADER}'\n")
    result = client.run(observe_session_op(str(tmp_path / "none.json"), ["squeue"],
                                           jobs_dir=str(tmp_path), job_files=["state"]))
    assert result.doc is None and result.known_ids == () and result.files == {}
    assert result.status.absent_ids == ()
