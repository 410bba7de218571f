"""Line assembly of tailed files, independent of any I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagster_slurm.agent.results import TailChunk, TailRequest
from dagster_slurm.pipes.tailing import TailedFile, Throttle, check_answer


@given(content=st.binary(max_size=500), cuts=st.lists(st.integers(0, 500), max_size=20))
def test_any_chunking_yields_the_same_lines(content: bytes, cuts: list[int]) -> None:
    bounds = sorted({0, len(content), *(c for c in cuts if c <= len(content))})
    tailed = TailedFile("messages", "/m")
    lines: list[bytes] = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        lines += tailed.feed(content[start:end])
    *complete, rest = content.split(b"\n")
    assert lines == complete
    assert tailed.take_pending() == (rest or None)
    assert tailed.take_pending() is None


def test_a_line_without_newline_is_cut_at_the_limit() -> None:
    tailed = TailedFile("stdout", "/o", max_line_bytes=4)
    assert tailed.feed(b"abc") == []
    assert tailed.feed(b"de") == [b"abcde"]
    assert tailed.feed(b"f\ng") == [b"f"]
    tailed.restart()
    assert (tailed.offset, tailed.take_pending()) == (0, None)


def test_throttle_allows_one_event_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    throttle = Throttle(5.0, lambda: now[0])
    assert throttle.ready() and not throttle.ready() and not throttle.ready()
    now[0] = 5.0
    assert throttle.ready() and throttle.take_suppressed() == 2 and throttle.take_suppressed() == 0


def _chunk(path: str, offset: int, data: bytes) -> TailChunk:
    return TailChunk(path, True, 100, offset, data, False, False)


@pytest.mark.parametrize(
    ("chunks", "problem"),
    [
        ([], "0 chunks for 1 files"),
        ([_chunk("/other", 5, b"abcde")], "answered /other for /m"),
        ([_chunk("/m", 6, b"abcde")], "inconsistent chunk"),
        ([_chunk("/m", 11, b"x" * 11)], "inconsistent chunk"),  # more than max_bytes
    ],
)
def test_check_answer_rejects_answers_that_do_not_fit(
    chunks: list[TailChunk], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        check_answer([TailRequest("/m", 0, 10)], chunks)
    check_answer([TailRequest("/m", 0, 10)], [_chunk("/m", 5, b"abcde")])
