"""The agent's submit operation writes the worker records the worker transitions describe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_support import write_script

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.exceptions import SubmitGuardFailed
from dagster_slurm.agent.ops import submit_op
from dagster_slurm.state import MemoryStateStore, new_session_document
from dagster_slurm.state import transitions as tr
from dagster_slurm.state import worker_transitions as wt

TOKEN = "dsr-worker-token-1"



def test_the_agent_writes_the_worker_records_the_transitions_describe(
    client: AgentClient, bindir: Path, tmp_path: Path
) -> None:
    config, shape = {"partition": "gpu", "num_nodes": 1}, {"partition": "gpu"}
    state_path = tmp_path / "s" / "allocation.json"
    write_script(bindir, "sbatch", "echo 'Submitted batch job 4343'\n")
    initial = new_session_document("dsr-x", run_id="r")
    result = client.run(submit_op(
        ["sbatch", "--parsable", f"--comment={TOKEN}", "worker.sh"], token=TOKEN,
        record=f"/worker_submissions/{TOKEN}",
        record_value=wt.worker_submission_record(config, shape, "gpus"),
        on_submitted=("/workers/{job_id}", wt.worker_record_value(config, "gpus")),
        guards=tr.SUBMIT_GUARDS, create=initial, state_path=str(state_path),
        lock_path=str(tmp_path / "s" / "lock"),
    ))
    assert result.job_id == "4343"
    on_cluster = json.loads(state_path.read_text())
    submission = on_cluster["worker_submissions"][TOKEN]

    memory = MemoryStateStore(initial, clock=lambda: submission["submitted_at"])
    decided = wt.submit_worker(tr.document(initial), token=TOKEN, config=config, shape=shape,
                               intent="gpus")
    assert isinstance(decided, tr.Change) and memory.transact(decided.patch).ok
    decided = wt.worker_submitted(tr.document(memory.snapshot().doc), token=TOKEN,
                                  job_id="4343", rc=0)
    assert isinstance(decided, tr.Change) and memory.transact(decided.patch).ok
    in_memory = memory.snapshot().doc or {}
    in_memory["worker_submissions"][TOKEN]["finished_at"] = submission["finished_at"]
    assert in_memory["worker_submissions"] == on_cluster["worker_submissions"]
    assert in_memory["workers"] == on_cluster["workers"]
    assert wt.worker_state(tr.document(on_cluster), token=TOKEN) is wt.WorkerState.SUBMITTED


def test_a_session_closed_while_sbatch_ran_gets_its_job_cancelled_and_no_worker_record(
    client: AgentClient, bindir: Path, tmp_path: Path
) -> None:
    state_path = tmp_path / "s" / "allocation.json"
    # sbatch answers after the session was closed (the teardown ran while it worked)
    write_script(bindir, "sbatch", f"""python3 - <<'PY'
import json
path = {str(state_path)!r}
doc = json.load(open(path))
doc["closed_at"] = 1.0
json.dump(doc, open(path, "w"))
PY
echo 'Submitted batch job 4344'
""")
    write_script(bindir, "scancel", f'echo "$@" >> {str(tmp_path / "scancel.args")!r}\n')
    initial = new_session_document("dsr-x", run_id="r")
    with pytest.raises(SubmitGuardFailed, match="job 4344 was submitted while guard") as caught:
        client.run(submit_op(
            ["sbatch", "--parsable", f"--comment={TOKEN}", "worker.sh"], token=TOKEN,
            record=f"/worker_submissions/{TOKEN}",
            record_value=wt.worker_submission_record({"partition": "gpu"}, {}, None),
            on_submitted=("/workers/{job_id}", wt.worker_record_value({"partition": "gpu"})),
            guards=tr.SUBMIT_GUARDS, create=initial, state_path=str(state_path),
            lock_path=str(tmp_path / "s" / "lock"),
        ))
    assert caught.value.details.get("job_id") == "4344" and caught.value.details.get("cancelled")
    assert (tmp_path / "scancel.args").read_text().split() == ["4344"]
    on_cluster = json.loads(state_path.read_text())
    assert on_cluster["worker_submissions"][TOKEN]["status"] == "cancelled"
    assert on_cluster["worker_submissions"][TOKEN]["job_id"] == "4344"
    assert "4344" not in (on_cluster.get("workers") or {})
