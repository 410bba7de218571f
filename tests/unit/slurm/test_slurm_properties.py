"""Property tests: parsers never raise, durations round-trip, unreadable fields are None."""

from __future__ import annotations

import math
import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.accounting import parse_sacct
from dagster_slurm.slurm.commands import SQUEUE_FIELDS, SbatchSpec, sbatch_argv
from dagster_slurm.slurm.directives import (
    FORBIDDEN_SBATCH_OPTIONS,
    MANAGED_SBATCH_OPTIONS,
    option_name,
    validate_extra_sbatch_directives,
)
from dagster_slurm.slurm.hostlist import expand_hostlist
from dagster_slurm.slurm.parsers import (
    min_job_age_seconds,
    parse_sbatch_parsable,
    parse_scontrol_config,
    parse_squeue,
    parse_test_only,
)
from dagster_slurm.slurm.states import JobState
from dagster_slurm.slurm.units import parse_size_bytes, parse_timestamp
from dagster_slurm.slurm.walltime import format_walltime, parse_duration, validate_walltime

# Text biased towards the characters Slurm output is made of.
SLURM_ALPHABET = "0123456789:-.|[],;=+_ \nTKMGNARDPCFSUIL/()abcnoe"
slurm_text = st.text(alphabet=SLURM_ALPHABET, max_size=300) | st.text(max_size=300)
cells = st.text(alphabet=SLURM_ALPHABET.replace("|", "").replace("\n", ""), max_size=25)


def _rows(columns: int) -> st.SearchStrategy[str]:
    row = st.lists(cells, min_size=columns, max_size=columns).map("|".join)
    return st.lists(row, max_size=5).map("\n".join)


@given(slurm_text)
def test_text_parsers_never_raise(text: str) -> None:
    JobState.parse(text)
    parse_duration(text)
    expand_hostlist(text)
    parse_size_bytes(text)
    parse_timestamp(text)
    parse_sbatch_parsable(text)
    parse_squeue(text)
    parse_sacct(text)
    min_job_age_seconds(parse_scontrol_config(text))


@given(slurm_text, st.one_of(st.none(), st.integers(min_value=-1000, max_value=1000)))
def test_test_only_parser_never_raises(text: str, exit_code: int | None) -> None:
    result = parse_test_only(text, exit_code)
    if exit_code not in (0, None):
        assert result.runnable is False


@given(_rows(len(SQUEUE_FIELDS)))
def test_squeue_rows_never_raise_and_keep_types(text: str) -> None:
    for record in parse_squeue(text):
        assert isinstance(record.state, JobState)
        assert record.job_id.strip() == record.job_id != ""
        for value in (record.name, record.reason, record.partition, record.comment):
            assert value is None or value != ""


@given(_rows(13))
def test_sacct_rows_never_raise(text: str) -> None:
    for job_id, record in parse_sacct(text).items():
        assert record.job_id == job_id
        assert "." not in job_id
        efficiency = record.cpu_efficiency
        assert efficiency is None or efficiency >= 0


@given(st.integers(min_value=0, max_value=10**9))
def test_durations_round_trip(seconds: int) -> None:
    text = format_walltime(seconds)
    assert parse_duration(text) == seconds
    if seconds > 0:
        assert validate_walltime("time_limit", text) == text


@given(
    st.integers(min_value=0, max_value=10**5),
    st.integers(min_value=0, max_value=23),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=0, max_value=59),
)
def test_every_slurm_format_reads_correctly(days: int, hours: int, minutes: int, secs: int) -> None:
    assert parse_duration(f"{days}-{hours}") == days * 86400 + hours * 3600
    assert parse_duration(f"{days}-{hours}:{minutes}") == days * 86400 + hours * 3600 + minutes * 60
    total = days * 86400 + hours * 3600 + minutes * 60 + secs
    assert parse_duration(f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}") == total
    assert parse_duration(f"{hours}:{minutes}:{secs}") == hours * 3600 + minutes * 60 + secs
    assert parse_duration(f"{minutes}:{secs}") == minutes * 60 + secs
    assert parse_duration(str(minutes)) == minutes * 60


@given(st.floats(allow_nan=False, min_value=0, max_value=1e9))
def test_format_walltime_never_shortens(seconds: float) -> None:
    parsed = parse_duration(format_walltime(seconds))
    assert parsed is not None and parsed >= seconds and parsed - seconds <= 1


@given(st.text(max_size=40))
def test_validate_walltime_raises_only_configuration_errors(text: str) -> None:
    try:
        canonical = validate_walltime("time_limit", text)
    except ConfigurationError as error:
        assert error.field == "time_limit"
    else:
        seconds = parse_duration(canonical)
        assert seconds is not None and seconds > 0
        assert seconds == parse_duration(text) or math.isinf(seconds)


unreadable_duration = st.sampled_from(["", "INVALID", "N/A", "NOT_SET", "soon", "-1:00", "1:99"])
unreadable_time = st.sampled_from(["", "N/A", "Unknown", "None", "2026-13-45T99:00:00", "now"])
unreadable_int = st.sampled_from(["", "N/A", "two", "-1", "1.5"])


@given(
    unreadable_duration, unreadable_duration, unreadable_duration,
    unreadable_time, unreadable_time, unreadable_int, unreadable_int,
)  # fmt: skip
def test_unreadable_squeue_fields_become_none(
    left: str, limit: str, elapsed: str, start: str, end: str, nodes: str, cpus: str
) -> None:
    row = f"5|n|R|None|{left}|{limit}|{start}|{end}|c[1-2]|{nodes}|N/A|cpu|{cpus}|x|{elapsed}|"
    (record,) = parse_squeue(row)
    assert record.state is JobState.RUNNING
    assert record.time_left_seconds is None
    assert record.time_limit_seconds is None
    assert record.elapsed_seconds is None
    assert record.start_time is None and record.end_time is None
    assert record.num_nodes is None and record.cpus is None
    assert record.min_memory_bytes is None
    assert record.comment is None


@settings(max_examples=200)
@given(st.lists(st.text(max_size=30), max_size=4))
def test_directive_validation_raises_only_configuration_errors(entries: list[str]) -> None:
    try:
        accepted = validate_extra_sbatch_directives(entries)
    except ConfigurationError as error:
        assert error.field.startswith("extra_sbatch_directives")
    else:
        names = [option_name(entry) for entry in accepted]
        assert None not in names
        assert len(set(names)) == len(names)
        assert not set(names) & (MANAGED_SBATCH_OPTIONS | FORBIDDEN_SBATCH_OPTIONS)
        assert not any(char.isspace() for entry in accepted for char in entry)


@given(st.text(max_size=60), st.text(max_size=60))
def test_spec_values_are_rejected_or_quoted_safely(comment: str, output: str) -> None:
    try:
        spec = SbatchSpec(job_name="j", script_path="/s.sh", comment=comment, output=output)
    except ConfigurationError as error:
        assert error.field in ("comment", "output")
        return
    argv = sbatch_argv(spec)
    assert shlex.split(shlex.join(argv)) == argv
    assert f"--comment={comment}" in argv
