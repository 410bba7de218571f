"""job_status and submit, with fake Slurm commands on PATH."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_support import write_script

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.exceptions import AgentOpError, SubmissionInDoubt
from dagster_slurm.agent.ops import job_status_op, submit_op, txn_op
from dagster_slurm.agent.remote.scheduler import listed_job_ids, parse_job_id
from dagster_slurm.agent.results import SubmitResult

TOKEN = "dgs-tok-1"



@pytest.fixture
def state(tmp_path: Path) -> dict[str, str]:
    return {
        "state_path": str(tmp_path / "s" / "allocation.json"),
        "lock_path": str(tmp_path / "s" / "lock"),
    }


def submit(client: AgentClient, state: dict[str, str], **kw: Any) -> SubmitResult:
    args = {
        "token": TOKEN,
        "record": f"/worker_submissions/{TOKEN}",
        "record_value": {"kind": "worker", "intent": "gpu"},
        "create": {"schema_version": 1},
        **state,
        **kw,
    }
    return client.run(submit_op(["sbatch", "--parsable", f"--comment={TOKEN}", "job.sh"], **args))


def test_job_status_runs_squeue_once_and_one_batched_sacct(
    client: AgentClient, bindir: Path, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    write_script(
        bindir,
        "squeue",
        f"""\
        echo "squeue $*" >> {calls}
        echo '101|RUNNING|tok'
        echo '102_3|PENDING|tok'
        """,
    )
    write_script(
        bindir,
        "sacct",
        f"""\
        echo "sacct $*" >> {calls}
        echo '103|COMPLETED'
        """,
    )
    status = tmp_path / "104.status"
    status.write_text("exit=0\n")
    result = client.run(
        job_status_op(
            ["squeue", "-h", "-o", "%i|%T|%k"],
            ["101", "102", "103", "104", "105"],
            sacct_argv=["sacct", "-n", "-P"],
            status_files={"104": str(status), "105": str(tmp_path / "105.status")},
        )
    )
    assert result.squeue.rc == 0 and "101|RUNNING" in result.squeue.stdout
    assert result.absent_ids == ("103", "104", "105")
    assert result.status_files["104"].exists and result.status_files["104"].data == "exit=0\n"
    assert not result.status_files["105"].exists
    # a status file does not spare sacct: the scheduler's final state decides how a job ended
    assert result.sacct_ids == ("103", "104", "105")
    assert result.sacct is not None and result.sacct.stdout == "103|COMPLETED\n"
    assert calls.read_text().splitlines() == [
        "squeue -h -o %i|%T|%k",
        "sacct -n -P --jobs=103,104,105",
    ]


def test_job_status_concludes_nothing_when_squeue_fails(
    client: AgentClient, bindir: Path, tmp_path: Path
) -> None:
    write_script(bindir, "squeue", "echo 'slurm_load_jobs error' >&2; exit 1\n")
    write_script(bindir, "sacct", f"touch {tmp_path / 'sacct-ran'}\n")
    result = client.run(job_status_op(["squeue"], ["1"], sacct_argv=["sacct"]))
    assert result.squeue.rc == 1 and "slurm_load_jobs" in result.squeue.stderr
    assert result.absent_ids is None and result.sacct is None
    assert not (tmp_path / "sacct-ran").exists()


def test_submit_records_the_token_before_sbatch_runs(
    client: AgentClient, bindir: Path, state: dict[str, str]
) -> None:
    doc = state["state_path"]
    # the fake sbatch fails unless the record exists, says "submitting" and no lock is held
    write_script(
        bindir,
        "sbatch",
        f"""\
        python3 - <<'EOF' || exit 3
        import json, os, sys
        record = json.load(open({doc!r}))["worker_submissions"][{TOKEN!r}]
        assert record["status"] == "submitting" and record["submitted_at"] > 0, record
        assert record["intent"] == "gpu"
        assert not os.path.exists({state["lock_path"]!r}), "lock held during sbatch"
        EOF
        echo 4242
        """,
    )
    result = submit(client, state)
    assert result.ok and result.job_id == "4242" and result.recorded and not result.recovered
    record = json.loads(Path(doc).read_text())["worker_submissions"][TOKEN]
    assert record["status"] == "submitted" and record["job_id"] == "4242"
    assert record["rc"] == 0 and record["finished_at"] >= record["submitted_at"]


def test_on_submitted_writes_the_job_record_in_the_same_transaction(
    client: AgentClient, bindir: Path, state: dict[str, str]
) -> None:
    write_script(bindir, "sbatch", "echo 'Submitted batch job 5150'\n")
    result = submit(client, state, on_submitted=("/workers/{job_id}", {"intent": "gpu"}))
    assert result.ok and result.version == 2  # record, then outcome + job record at once
    doc = json.loads(Path(state["state_path"]).read_text())
    submitted_at = doc["worker_submissions"][TOKEN]["submitted_at"]
    assert doc["workers"]["5150"] == {
        "intent": "gpu",
        "job_id": "5150",
        "token": TOKEN,
        "submitted_at": submitted_at,
    }


def test_on_submitted_is_skipped_when_sbatch_fails(
    client: AgentClient, bindir: Path, state: dict[str, str]
) -> None:
    write_script(bindir, "sbatch", "exit 1\n")
    result = submit(client, state, on_submitted=("/workers/{job_id}", {}))
    assert result.status == "failed"
    assert "workers" not in json.loads(Path(state["state_path"]).read_text())


def test_failed_sbatch_is_recorded_and_returned(
    client: AgentClient, bindir: Path, state: dict[str, str]
) -> None:
    write_script(bindir, "sbatch", "echo 'sbatch: error: invalid partition' >&2; exit 1\n")
    result = submit(client, state)
    assert not result.ok and result.status == "failed" and result.rc == 1
    assert "invalid partition" in result.stderr
    record = json.loads(Path(state["state_path"]).read_text())["worker_submissions"][TOKEN]
    assert record["status"] == "failed" and "invalid partition" in record["error"]


def test_a_refusal_named_in_release_on_leaves_no_record_and_the_token_submits_again(
    client: AgentClient, bindir: Path, state: dict[str, str], tmp_path: Path
) -> None:
    refused = tmp_path / "refused"
    refused.write_text("")
    write_script(bindir, "sbatch", f"""\
        if [ -f {refused} ]; then
          echo 'sbatch: error: AssocMaxSubmitJobLimit' >&2
          echo 'sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user'"'"'s size and/or time limits)' >&2
          exit 1
        fi
        echo 'Submitted batch job 78'
        """)
    result = submit(client, state, release_on=("AssocMaxSubmitJobLimit",))
    assert not result.ok and result.status == "failed"
    assert "AssocMaxSubmitJobLimit" in result.stderr
    doc = json.loads(Path(state["state_path"]).read_text())
    assert TOKEN not in (doc.get("worker_submissions") or {})
    refused.unlink()  # a job of the user ended
    again = submit(client, state, release_on=("AssocMaxSubmitJobLimit",))
    assert again.ok and again.job_id == "78" and not again.recovered


def test_a_token_is_submitted_at_most_once(
    client: AgentClient, bindir: Path, state: dict[str, str], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    write_script(bindir, "sbatch", f"echo run >> {runs}; echo 'Submitted batch job 77'\n")
    first = submit(client, state)
    again = submit(client, state)
    assert first.job_id == again.job_id == "77"
    assert again.recovered and again.rc is None
    assert runs.read_text() == "run\n"


def test_an_unfinished_record_is_in_doubt_and_not_resubmitted(
    client: AgentClient, bindir: Path, state: dict[str, str], tmp_path: Path
) -> None:
    write_script(bindir, "sbatch", f"touch {tmp_path / 'ran'}; echo 1\n")
    client.run(
        txn_op(
            state["state_path"],
            state["lock_path"],
            [
                {
                    "op": "add",
                    "path": "/worker_submissions",
                    "value": {TOKEN: {"status": "submitting"}},
                }
            ],
            create={},
        )
    )
    with pytest.raises(SubmissionInDoubt) as info:
        submit(client, state)
    assert info.value.details["record"] == {"status": "submitting"}
    assert not (tmp_path / "ran").exists()


def test_sbatch_timeout_leaves_status_unknown(
    client: AgentClient, bindir: Path, state: dict[str, str]
) -> None:
    write_script(bindir, "sbatch", "sleep 30\n")
    result = submit(client, state, timeout=0.5)
    assert result.status == "unknown" and result.job_id is None
    record = json.loads(Path(state["state_path"]).read_text())["worker_submissions"][TOKEN]
    assert record["status"] == "unknown"


def test_submit_requires_the_token_in_argv(client: AgentClient, state: dict[str, str]) -> None:
    with pytest.raises(AgentOpError, match="must carry the token"):
        client.run(submit_op(["sbatch", "job.sh"], token=TOKEN, record=f"/s/{TOKEN}", **state))


@pytest.mark.parametrize(
    ("stdout", "job_id"),
    [
        ("4242\n", "4242"),
        ("4242;cluster\n", "4242"),
        ("Submitted batch job 9\n", "9"),
        ("warning: x\n12\n", "12"),
        ("", None),
        ("error\n", None),
    ],
)
def test_parse_job_id(stdout: str, job_id: str | None) -> None:
    assert parse_job_id(stdout) == job_id


def test_listed_job_ids_match_the_first_field_only() -> None:
    out = "11|R|node12\n12_4|PD|x\n 13 R\n1300|R|x\n"
    assert listed_job_ids(out, ["11", "12", "13", "130", "14"]) == {"11", "12", "13"}


# -- the head's submission record is the transitions' record ----------------------------------
def _head_submit(client: AgentClient, state: dict[str, str], token: str, create: dict) -> Any:
    from dagster_slurm.state import transitions as tr

    return client.run(submit_op(
        ["sbatch", "--parsable", f"--comment={token}", "job.sh"], token=token,
        record="/allocation", record_value=tr.head_submission_record({"num_nodes": 2}),
        create=create, guards=tr.SUBMIT_GUARDS, **state,
    ))


def test_the_agent_writes_the_head_record_the_transitions_describe(
    client: AgentClient, bindir: Path, state: dict[str, str]
) -> None:
    from dagster_slurm.state import MemoryStateStore, new_session_document
    from dagster_slurm.state import transitions as tr

    write_script(bindir, "sbatch", "echo 'Submitted batch job 4242'\n")
    initial = new_session_document("dsr-x", run_id="r")
    assert _head_submit(client, state, TOKEN, initial).job_id == "4242"
    on_cluster = json.loads(Path(state["state_path"]).read_text())["allocation"]

    memory = MemoryStateStore(initial, clock=lambda: on_cluster["submitted_at"])
    for decided in (tr.submit_head(None, token=TOKEN, config={"num_nodes": 2}),
                    tr.head_submitted(None, token=TOKEN, job_id="4242", rc=0)):
        assert isinstance(decided, tr.Change)
        assert memory.transact(decided.patch).ok
    in_memory = (memory.snapshot().doc or {})["allocation"]
    in_memory["finished_at"] = on_cluster["finished_at"]  # two clocks, otherwise equal
    assert in_memory == on_cluster
    typed = tr.document(json.loads(Path(state["state_path"]).read_text()))
    assert tr.head_state(typed) is tr.HeadState.SUBMITTED


def test_a_closed_session_gets_no_submission_and_sbatch_does_not_run(
    client: AgentClient, bindir: Path, state: dict[str, str], tmp_path: Path
) -> None:
    from dagster_slurm.agent.exceptions import SubmitGuardFailed
    from dagster_slurm.state import new_session_document

    write_script(bindir, "sbatch", f"touch {tmp_path / 'ran'}; echo 'Submitted batch job 1'\n")
    client.run(txn_op(state["state_path"], state["lock_path"],
                      [{"op": "add", "path": "/closed_at", "value": 5.0}],
                      create=new_session_document("dsr-x")))
    with pytest.raises(SubmitGuardFailed, match="closed_at"):
        _head_submit(client, state, TOKEN, new_session_document("dsr-x"))
    assert not (tmp_path / "ran").exists()
    assert json.loads(Path(state["state_path"]).read_text()).get("allocation") is None


def test_guards_must_be_test_or_absent_operations(
    client: AgentClient, state: dict[str, str]
) -> None:
    with pytest.raises(AgentOpError, match="guards"):
        client.run(submit_op(["sbatch", f"--comment={TOKEN}"], token=TOKEN, record="/a",
                             guards=[{"op": "add", "path": "/x", "value": 1}], **state))
