"""PipesTailMessageReader against a recording handler: lines, offsets, retries, final drain."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipes_support import CountingSource, FakeClock, FlakySource, RecordingHandler, log_line

from dagster_slurm.agent.results import TailChunk, TailRequest
from dagster_slurm.errors import LoginRequired, TransportError
from dagster_slurm.pipes.poller import TailPoller
from dagster_slurm.pipes.reader import PipesTailMessageReader
from dagster_slurm.pipes.sources import FileSource, LocalFileSource


class Files:
    """The three files of a job in a directory."""

    def __init__(self, directory: Path) -> None:
        self.messages = directory / "messages.jsonl"
        self.stdout = directory / "stdout.txt"
        self.stderr = directory / "stderr.txt"

    def append(self, path: Path, data: bytes) -> None:
        with path.open("ab") as f:
            f.write(data)

    def reader(self, source: FileSource | None = None, **kwargs: object) -> PipesTailMessageReader:
        return PipesTailMessageReader(
            source or LocalFileSource(),
            str(self.messages),
            str(self.stdout),
            str(self.stderr),
            **kwargs,  # type: ignore[arg-type]
        )


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_yields_the_path_for_the_default_message_writer(files: Files) -> None:
    reader = files.reader()
    with reader.read_messages(RecordingHandler()) as params:  # type: ignore[arg-type]
        assert params == {"path": str(files.messages)}


def test_partial_lines_wait_for_their_newline(files: Files) -> None:
    handler = RecordingHandler()
    out: list[str] = []
    reader = files.reader(poll_interval=0.02, stdout_sink=out.append)
    first, second = log_line("first"), log_line("second")
    files.append(files.messages, first + second[:10])
    files.append(files.stdout, b"complete\npart")
    with reader.read_messages(handler):  # type: ignore[arg-type]
        wait_for(lambda: handler.logs() == ["first"] and out == ["complete"])
        polls = reader.stats.polls
        wait_for(lambda: reader.stats.polls >= polls + 5)  # several polls see the half line
        assert handler.logs() == ["first"] and out == ["complete"]
        files.append(files.messages, second[10:])
        files.append(files.stdout, b"ial\n")
        wait_for(lambda: handler.logs() == ["first", "second"] and out == ["complete", "partial"])
    assert handler.logs() == ["first", "second"]


def test_one_read_per_poll_covers_all_three_files(files: Files) -> None:
    files.append(files.stdout, b"")
    source = CountingSource(LocalFileSource())
    reader = files.reader(source, poll_interval=0.01)
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        wait_for(lambda: reader.stats.polls >= 5)
    assert len(source.requests) == reader.stats.polls
    expected = [str(files.messages), str(files.stdout), str(files.stderr)]
    assert all([r.path for r in requests] == expected for requests in source.requests)


def test_stdout_and_stderr_lines_reach_sinks_and_tails(files: Files) -> None:
    out: list[str] = []
    err: list[str] = []
    files.append(files.stdout, b"".join(f"out {i}\r\n".encode() for i in range(150)))
    files.append(files.stderr, "caf\xe9 \xff\n".encode("latin-1") + b"boom\n")
    reader = files.reader(stdout_sink=out.append, stderr_sink=err.append, tail_lines=100)
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        pass
    assert out == [f"out {i}" for i in range(150)]
    assert err == ["caf\ufffd \ufffd", "boom"]
    assert reader.stdout_tail().splitlines() == [f"out {i}" for i in range(50, 150)]
    assert reader.stdout_tail(2) == "out 148\nout 149"
    assert reader.stderr_tail(0) == ""
    assert (reader.stats.stdout_lines, reader.stats.stderr_lines) == (150, 2)


def test_default_sinks_write_to_this_process_stdout_and_stderr(
    files: Files, capsys: pytest.CaptureFixture[str]
) -> None:
    files.append(files.stdout, b"to stdout\n")
    files.append(files.stderr, b"to stderr\n")
    with files.reader().read_messages(RecordingHandler()):  # type: ignore[arg-type]
        pass
    captured = capsys.readouterr()
    assert captured.out == "to stdout\n" and captured.err == "to stderr\n"


def test_invalid_lines_are_logged_with_their_number_and_skipped(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    files.append(files.messages, log_line("a") + b"{not json\n" + b"[1, 2]\n\n" + log_line("b"))
    handler = RecordingHandler()
    reader = files.reader()
    with caplog.at_level(logging.WARNING, "dagster_slurm.pipes"):
        with reader.read_messages(handler):  # type: ignore[arg-type]
            pass
    assert handler.logs() == ["a", "b"]
    warnings = [r.getMessage() for r in caplog.records]
    assert any("line 2 of" in w and "not JSON" in w for w in warnings)
    assert any("line 3 of" in w and "not a Pipes message" in w for w in warnings)
    assert (reader.stats.invalid_lines, reader.stats.messages) == (2, 2)


def test_a_failing_handler_does_not_stop_the_reader(files: Files) -> None:
    custom = {"__dagster_pipes_version": "0.1", "method": "report_custom_message", "params": {}}
    files.append(files.messages, log_line("a") + (json.dumps(custom) + "\n").encode())
    files.append(files.messages, log_line("b"))
    handler = RecordingHandler(fail_on="report_custom_message")
    with files.reader().read_messages(handler):  # type: ignore[arg-type]
        pass
    assert handler.logs() == ["a", "b"]
    assert len(handler.framework_exceptions) == 1
    assert "message 2" in handler.framework_exceptions[0]


def test_catches_up_without_sleeping_between_chunks(files: Files) -> None:
    lines = [log_line(f"message {i} " + "x" * 100) for i in range(20_000)]
    files.append(files.messages, b"".join(lines))  # ~2.6 MB, ~40 chunks of 64 KiB
    handler = RecordingHandler()
    reader = files.reader(poll_interval=30.0, max_bytes_per_file=64 * 1024)
    with reader.read_messages(handler):  # type: ignore[arg-type]
        wait_for(lambda: len(handler.messages) == 20_000, timeout=20)
        assert reader.stats.polls >= 40
    assert handler.logs() == [f"message {i} " + "x" * 100 for i in range(20_000)]


def test_a_poll_whose_handling_outlasted_the_interval_is_followed_at_once(files: Files) -> None:
    """Handing the first chunk to Dagster takes an hour on the reader's clock, and the payload
    wrote more meanwhile: the reader reads on without waiting ``poll_interval`` again."""
    clock = FakeClock()
    files.append(files.messages, log_line("first"))

    class SlowHandler(RecordingHandler):
        def handle_message(self, message: dict) -> None:
            super().handle_message(message)
            if len(self.messages) == 1:
                files.append(files.messages, log_line("second"))
                clock.now += 3600.0

    handler = SlowHandler()
    reader = files.reader(poll_interval=600.0, clock=clock)
    with reader.read_messages(handler):  # type: ignore[arg-type]
        wait_for(lambda: handler.logs() == ["first", "second"])
        assert reader.stats.polls == 2


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(st.text(min_size=0, max_size=40), min_size=1, max_size=60),
    stdout=st.binary(max_size=300),
    max_bytes=st.integers(min_value=1, max_value=200),
    every=st.integers(min_value=2, max_value=5),
    lose_answer=st.booleans(),
)
def test_failed_polls_neither_lose_nor_repeat_anything(
    texts: list[str], stdout: bytes, max_bytes: int, every: int, lose_answer: bool
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        files = Files(Path(directory))
        files.append(files.messages, b"".join(log_line(t) for t in texts))
        files.append(files.stdout, stdout)
        out: list[str] = []
        source = FlakySource(LocalFileSource(), every, lose_answer=lose_answer)
        reader = files.reader(
            source,
            max_bytes_per_file=max_bytes,
            stdout_sink=out.append,
            poll_interval=0.001,
            sleep=lambda _: None,
        )
        handler = RecordingHandler()
        with reader.read_messages(handler):  # type: ignore[arg-type]
            pass
    assert handler.logs() == texts
    expected = stdout.split(b"\n")
    if expected[-1] == b"":
        expected.pop()
    assert out == [line.decode("utf-8", "replace").removesuffix("\r") for line in expected]
    assert reader.stats.failed_polls == source.failures


def test_failed_polls_are_retried_and_warned_about_sparingly(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    files.append(files.messages, b"".join(log_line(str(i)) for i in range(50)))
    source = FlakySource(LocalFileSource(), every=2)
    handler = RecordingHandler()
    reader = files.reader(source, max_bytes_per_file=100, poll_interval=0.001, warning_interval=60)
    with caplog.at_level(logging.WARNING, "dagster_slurm.pipes"):
        with reader.read_messages(handler):  # type: ignore[arg-type]
            pass
    assert handler.logs() == [str(i) for i in range(50)]
    assert reader.stats.failed_polls >= 10
    retries = [r for r in caplog.records if "retrying from the same offsets" in r.getMessage()]
    assert len(retries) == 1 and "TransportError" in retries[0].getMessage()


class DownSource:
    """A cluster that cannot be reached until ``up`` is set."""

    def __init__(self) -> None:
        self.up = False

    def read(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        if not self.up:
            raise TransportError("ssh: connect to host login1 port 22: Connection refused")
        return LocalFileSource().read(requests)


def test_last_poll_error_tracks_the_latest_poll(files: Files) -> None:
    source = DownSource()
    reader = files.reader(source, poll_interval=0.01, max_retry_interval=0.02)
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        wait_for(lambda: reader.stats.failed_polls >= 3)
        assert isinstance(reader.last_poll_error, TransportError)
        source.up = True
        wait_for(lambda: reader.last_poll_error is None)
    assert reader.stats.polls > reader.stats.failed_polls >= 3


def test_final_drain_gives_up_after_its_timeout_naming_what_was_not_read(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    reader = files.reader(DownSource(), drain_timeout=60.0, clock=clock, sleep=clock.sleep)
    with caplog.at_level(logging.WARNING, "dagster_slurm.pipes"):
        with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
            pass
    assert clock.now >= 60.0
    final = [m for m in caplog.messages if "did not finish within 60 s" in m]
    assert len(final) == 1
    assert f"{files.messages} (not reached)" in final[0] and "Connection refused" in final[0]


class LoginGoneSource:
    """A cluster whose shared login has ended."""

    def read(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
        raise LoginRequired("the shared login is not up. Log in once with: dagster-slurm login")


def test_final_drain_stops_at_once_when_the_login_needs_a_person(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    reader = files.reader(LoginGoneSource(), drain_timeout=60.0, clock=clock, sleep=clock.sleep)
    with caplog.at_level(logging.WARNING, "dagster_slurm.pipes"):
        with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
            pass
    assert clock.now < 60.0, "the drain waited for a login nobody gives"
    assert any("final read of the Pipes files stopped" in m and "dagster-slurm login" in m
               for m in caplog.messages)


def test_final_drain_waits_for_the_closed_message_within_its_grace(files: Files) -> None:
    opened = {"__dagster_pipes_version": "0.1", "method": "opened", "params": {}}
    files.append(files.messages, (json.dumps(opened) + "\n").encode())
    clock = FakeClock()
    reader = files.reader(closed_grace=3.0, clock=clock, sleep=clock.sleep)
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        pass
    assert 3.0 <= clock.now < 4.0 and not reader.received_closed
    closed = {"__dagster_pipes_version": "0.1", "method": "closed", "params": {}}
    files.append(files.messages, (json.dumps(closed) + "\n").encode())
    clock.now = 0.0
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        pass
    assert clock.now < 1.0 and reader.received_closed


def test_final_drain_delivers_unterminated_last_lines(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    files.append(files.messages, log_line("a") + log_line("b").rstrip(b"\n"))
    files.append(files.stdout, b"no newline at the end")
    out: list[str] = []
    handler = RecordingHandler()
    with caplog.at_level(logging.WARNING, "dagster_slurm.pipes"):
        with files.reader(stdout_sink=out.append).read_messages(handler):  # type: ignore[arg-type]
            pass
    assert handler.logs() == ["a", "b"] and out == ["no newline at the end"]
    assert any("line 2 of" in r.getMessage() for r in caplog.records)


def test_a_file_rewritten_shorter_is_read_again_from_its_start(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    out: list[str] = []
    files.append(files.stdout, b"first attempt, a long line\n")
    reader = files.reader(stdout_sink=out.append, poll_interval=0.01)
    with caplog.at_level(logging.WARNING, "dagster_slurm.pipes"):
        with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
            wait_for(lambda: out == ["first attempt, a long line"])
            files.stdout.write_bytes(b"requeued\n")
            wait_for(lambda: len(out) == 2)
    assert out == ["first attempt, a long line", "requeued"]
    assert any("reading it again from the start" in r.getMessage() for r in caplog.records)


def test_an_inconsistent_answer_counts_as_a_failed_poll(files: Files) -> None:
    class Inconsistent:
        calls = 0

        def read(self, requests: Sequence[TailRequest]) -> list[TailChunk]:
            self.calls += 1
            chunks = LocalFileSource().read(requests)
            return chunks[:-1] if self.calls == 1 else chunks

    files.append(files.messages, log_line("only once"))
    handler = RecordingHandler()
    reader = files.reader(Inconsistent(), sleep=lambda _: None)
    with reader.read_messages(handler):  # type: ignore[arg-type]
        pass
    assert handler.logs() == ["only once"]
    assert reader.stats.failed_polls == 1
    assert reader.stats.polls >= 2


def test_debug_text_names_the_files_the_launch_and_the_last_stderr_lines(files: Files) -> None:
    files.append(files.stderr, b"Traceback (most recent call last):\nImportError: numpy\n")
    reader = files.reader()
    reader.on_launched({"extras": {"slurm_job_id": "4242"}})
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        pass
    text = reader.no_messages_debug_text()
    assert str(files.messages) in text and str(files.stdout) in text and str(files.stderr) in text
    assert reader.launched_payload_hint == "slurm_job_id=4242" and "slurm_job_id=4242" in text
    assert text.endswith("ImportError: numpy")


def test_stats_count_one_block(files: Files) -> None:
    files.append(files.messages, log_line("a") + log_line("b"))
    files.append(files.stdout, b"x\n")
    reader = files.reader()
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        pass
    first = reader.stats
    assert (first.messages, first.stdout_lines, first.failed_polls) == (2, 1, 0)
    assert first.bytes_read == first.message_bytes + 2 and first.polls >= 1
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        pass
    assert reader.stats.messages == 2  # a new block starts from the start of the files


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"messages_path": ""}, "messages_path"),
        ({"stdout_path": "/j/m"}, "distinct"),
        ({"poll_interval": 0}, "positive"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict[str, object], problem: str) -> None:
    arguments: dict[str, object] = {"source": LocalFileSource(), "messages_path": "/j/m", **kwargs}
    with pytest.raises(ValueError, match=problem):
        PipesTailMessageReader(**arguments)  # type: ignore[arg-type]


def test_one_block_at_a_time(files: Files) -> None:
    reader = files.reader()
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="already reading"):
            with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
                pass
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        pass


def test_polls_slowly_until_a_file_exists_and_wakes_on_request(files: Files) -> None:
    reader = files.reader(poll_interval=30.0, idle_interval=60.0)
    with reader.read_messages(RecordingHandler()):  # type: ignore[arg-type]
        wait_for(lambda: reader.stats.polls == 1)  # the job is queued: nothing to read yet
        files.append(files.stdout, b"started\n")
        reader.wake()
        wait_for(lambda: reader.stats.polls == 2)  # woken, not at the end of its wait
        wait_for(lambda: reader.stats.stdout_lines == 1)


def test_the_wait_doubles_from_poll_interval_to_idle_interval_while_no_file_exists(
    files: Files,
) -> None:
    reader = files.reader(poll_interval=0.25, idle_interval=1.0)
    # the reader's polling, built as the reader builds it, on the reader's settings
    poller = TailPoller(reader, {"stdout": lambda line: None, "stderr": lambda line: None},
                        tail_lines=10, clock=time.monotonic, sleep=time.sleep, label="test")
    assert [poller.next_wait() for _ in range(7)] == [0.25] * 4 + [0.5, 1.0, 1.0]
    poller.files_seen = True  # once a file exists, poll_interval applies
    assert poller.next_wait() == 0.25
