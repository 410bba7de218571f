"""The attach-or-start-fresh decision of a run-scope call, its record and the call numbering."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from dagster_slurm.agent.results import TailChunk, TailResult
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.frontend.reattach import (
    Attach,
    CallCounter,
    CallRecord,
    Fresh,
    attempt_of,
    decide,
    payload_fingerprint,
)
from dagster_slurm.session.frontend.runner import read_call_record

PAYLOAD = payload_fingerprint("process.py", BashLauncher())


def _record(**changes: object) -> CallRecord:
    fields: dict[str, object] = {
        "job_id": "41", "invocation": "0123abcd4567", "request_id": "feedbeef00112233",
        "step_name": "my_asset", "payload": PAYLOAD,
    }
    return CallRecord(**{**fields, **changes})  # type: ignore[arg-type]


# -- decide --------------------------------------------------------------------------------------


def test_a_call_without_a_record_starts_fresh() -> None:
    decided = decide(None, job_id="41", payload=PAYLOAD)
    assert isinstance(decided, Fresh) and not decided.warning


def test_a_record_of_the_current_allocation_and_payload_is_attached_to() -> None:
    record = _record()
    decided = decide(record, job_id="41", payload=PAYLOAD)
    assert isinstance(decided, Attach)
    assert decided.record is record
    assert "0123abcd4567" in decided.reason


def test_a_record_of_another_allocation_is_not_attached_to() -> None:
    decided = decide(_record(job_id="40"), job_id="41", payload=PAYLOAD)
    assert isinstance(decided, Fresh)
    assert "40" in decided.reason and "41" in decided.reason


def test_a_record_of_another_payload_starts_fresh_with_a_warning() -> None:
    other = payload_fingerprint("other.py", BashLauncher())
    decided = decide(_record(), job_id="41", payload=other)
    assert isinstance(decided, Fresh) and decided.warning
    assert "other.py" in decided.reason and "process.py" in decided.reason


@pytest.mark.parametrize("present", [False, True])
@pytest.mark.parametrize("job_id", ["41", "40"])
@pytest.mark.parametrize("payload", [PAYLOAD, "RayLauncher:process.py"])
def test_attach_only_when_every_condition_holds(present: bool, job_id: str, payload: str) -> None:
    record = _record(job_id=job_id) if present else None
    decided = decide(record, job_id="41", payload=payload)
    expected = present and job_id == "41" and payload == PAYLOAD
    assert isinstance(decided, Attach) is expected


def test_the_fingerprint_names_the_payload_and_the_launcher_class() -> None:
    assert payload_fingerprint("a.py", BashLauncher()) != payload_fingerprint("a.py", RayLauncher())
    assert payload_fingerprint("a.py", BashLauncher()) != payload_fingerprint("b.py", BashLauncher())
    # settings of the launcher are not part of it
    assert payload_fingerprint("a.py", BashLauncher(pre_start_commands=["true"])) == \
        payload_fingerprint("a.py", BashLauncher())


# -- the record ----------------------------------------------------------------------------------


def test_a_record_survives_its_json() -> None:
    record = _record()
    assert CallRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize("text", [
    "", "{", "[]", '{"version": 2}',
    '{"version": 1, "job_id": "41", "invocation": "", "request_id": "r", '
    '"step_name": "s", "payload": "p"}',
    '{"version": 1, "job_id": "41", "invocation": "i", "request_id": 7, '
    '"step_name": "s", "payload": "p"}',
])
def test_text_that_is_not_a_record_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        CallRecord.from_json(text)


def test_the_record_lives_in_its_allocation_next_to_not_among_the_invocations() -> None:
    paths = SessionPaths.create("/base", "run-1", "abcd1234")
    invocation = paths.invocation("41", "my asset", "0123abcd4567")
    record = paths.call_record("41", "my asset", 0)
    assert record == f"{paths.job_dir('41')}/calls/my-asset/0.json"
    assert record.rsplit("/", 1)[0] == paths.calls_dir("41", "my asset")
    assert not record.startswith(invocation.step_dir + "/")
    assert invocation.invocation == "0123abcd4567"
    assert paths.call_record("42", "my asset", 1).startswith(paths.job_dir("42") + "/")


# -- numbering of the calls ----------------------------------------------------------------------


def test_the_calls_of_one_attempt_get_successive_indices() -> None:
    counter = CallCounter()
    assert [counter.next("run", "step", 0) for _ in range(3)] == [0, 1, 2]


def test_a_retried_attempt_counts_from_zero_again() -> None:
    counter = CallCounter()
    counter.next("run", "step", 0)
    counter.next("run", "step", 0)
    assert counter.next("run", "step", 1) == 0
    assert counter.next("run", "step", 1) == 1


def test_steps_and_runs_are_counted_apart() -> None:
    counter = CallCounter()
    counter.next("run", "a", 0)
    assert counter.next("run", "b", 0) == 0
    assert counter.next("other", "a", 0) == 0
    assert counter.next("run", "a", 0) == 1


def test_concurrent_calls_get_distinct_indices() -> None:
    counter = CallCounter()
    got: list[int] = []
    lock = threading.Lock()

    def call() -> None:
        index = counter.next("run", "step", 0)
        with lock:
            got.append(index)

    threads = [threading.Thread(target=call) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == list(range(16))


def test_the_attempt_is_the_steps_retry_number() -> None:
    step = SimpleNamespace(previous_attempt_count=2)
    context = SimpleNamespace(get_step_execution_context=lambda: step)
    assert attempt_of(context) == 2


# -- reading the record --------------------------------------------------------------------------


class _OneFileAgent:
    """Answers a tail request with one file's bytes (None: the file does not exist)."""

    def __init__(self, data: bytes | None) -> None:
        self.data = data
        self.asked: list[object] = []

    def run(self, op: object) -> TailResult:
        self.asked.append(op)
        path = op.params["files"][0]["path"]  # type: ignore[attr-defined]
        data = self.data or b""
        return TailResult((TailChunk(path, self.data is not None, len(data), len(data), data,
                                     True, False),))


def test_a_missing_record_reads_as_none() -> None:
    agent = _OneFileAgent(None)
    assert read_call_record(agent, "/s/jobs/41/calls/a/0.json") is None
    assert len(agent.asked) == 1, "one round trip"


def test_a_written_record_is_read_back() -> None:
    record = _record()
    assert read_call_record(_OneFileAgent(record.to_json().encode()), "/r") == record


def test_an_unreadable_record_stops_the_call_naming_the_file() -> None:
    with pytest.raises(SessionError) as caught:
        read_call_record(_OneFileAgent(b'{"version": 1'), "/s/jobs/41/calls/a/0.json")
    message = str(caught.value)
    assert "/s/jobs/41/calls/a/0.json" in message and "remove the file" in message
