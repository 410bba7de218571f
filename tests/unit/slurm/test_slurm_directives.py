from __future__ import annotations

import pytest

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.directives import (
    FORBIDDEN_SBATCH_OPTIONS,
    MANAGED_SBATCH_OPTIONS,
    SHORT_OPTION_NAMES,
    option_name,
    validate_extra_sbatch_directives,
)

BRIEF_MANAGED = {
    "job-name", "output", "error", "chdir", "parsable", "wrap", "test-only", "comment",
    "partition", "qos", "account", "reservation", "time", "time-min", "nodes", "ntasks",
    "ntasks-per-node", "cpus-per-task", "mem", "mem-per-cpu", "gres", "gpus",
    "gpus-per-node", "signal", "nodelist", "export", "array", "hold",
}  # fmt: skip


def test_managed_options_cover_every_first_class_option() -> None:
    assert BRIEF_MANAGED <= MANAGED_SBATCH_OPTIONS
    assert "exclusive" in MANAGED_SBATCH_OPTIONS
    assert MANAGED_SBATCH_OPTIONS.isdisjoint(FORBIDDEN_SBATCH_OPTIONS)


def test_valid_entries_are_kept_in_order() -> None:
    entries = [
        "--dependency=afterany:123",
        "--constraint=a100|h100",
        "--begin=now+1hour",
        "--overcommit",
        "--mail-type=END,FAIL",
        "--gres-flags=enforce-binding",  # longer than a managed name, not an abbreviation
        "--mem-bind=local",
    ]
    assert validate_extra_sbatch_directives(entries) == tuple(entries)


def test_none_and_empty() -> None:
    assert validate_extra_sbatch_directives(None) == ()
    assert validate_extra_sbatch_directives([]) == ()


def _problem(entries: list[str], field: str = "extra_sbatch_directives") -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        validate_extra_sbatch_directives(entries, field=field)
    return caught.value


@pytest.mark.parametrize(
    ("entry", "advice"),
    [
        ("--time=01:00:00", "use the first-class field time_limit"),
        ("--time", "use the first-class field time_limit"),
        ("--time-min=10", "time_min"),
        ("--partition=gpu", "use the first-class field partition"),
        ("--nodes=2", "num_nodes"),
        ("--cpus-per-task=4", "use the first-class field cpus"),
        ("--gres=gpu:1", "gpus_per_node"),
        ("--gpus=1", "gpus_per_node"),
        ("--signal=B:USR1@60", "signal_before_timeout"),
        ("--mem-per-cpu=1G", "mem_per_cpu"),
        ("--wrap=touch x", "not allowed"),
        ("--wrap=id", "not allowed"),
        ("--job-name=x", "set by the library"),
        ("--comment=tok", "submission token"),
        ("--output=/tmp/x", "set by the library"),
        ("--parsable", "set by the library"),
        ("--test-only", "not allowed"),
        ("--array=1-3", "job arrays of partitioned runs"),
        ("--array=0-9%2", "do not pass --array yourself"),
        ("--wait", "block sbatch"),
        ("--clusters=other", "another cluster"),
        ("--TIME=5", "time_limit"),
        ("--requeue", "use the first-class field requeue"),
        ("--no-requeue", "use the first-class field requeue"),
    ],
)
def test_reserved_options_name_the_replacement(entry: str, advice: str) -> None:
    error = _problem(["--overcommit", entry])
    assert error.field == "extra_sbatch_directives[1]"
    assert error.value == entry
    assert advice in str(error)
    assert repr(entry) in str(error)


@pytest.mark.parametrize(
    ("entry", "full"),
    [
        ("--tim=5", "time"),
        ("--part=gpu", "partition"),
        ("--acc=x", "account"),
        ("--t=1", "test-only"),
    ],
)
def test_abbreviations_of_reserved_options_are_rejected(entry: str, full: str) -> None:
    assert "abbreviation of --" + full in str(_problem([entry]))


@pytest.mark.parametrize("letter", sorted(SHORT_OPTION_NAMES))
def test_short_forms_of_reserved_options_are_rejected(letter: str) -> None:
    error = _problem([f"-{letter}"])
    assert f"-{letter} is --{SHORT_OPTION_NAMES[letter]}" in str(error)


@pytest.mark.parametrize("entry", ["-x", "-C", "-d", "-Cgpu"])
def test_other_short_forms_are_rejected(entry: str) -> None:
    assert "only long-form options" in str(_problem([entry]))


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("--constraint=a b", "whitespace"),
        ("--begin=now\n#SBATCH --wrap=id", "whitespace"),
        ("--constraint=a\tb", "whitespace"),
        ("--mail-user=\x00", "control"),
        ("--constraint='a100'", "quotes"),
        ('--constraint="a100"', "quotes"),
        ("--constraint=a\\b", "backslashes"),
        ("constraint=a100", "long-form option"),
        ("#SBATCH --constraint=a100", "whitespace"),
        ("--", "long-form option"),
        ("---x", "long-form option"),
        ("--Constraint=x", "lower-case"),
        ("--1x", "long-form option"),
        ("--constraint=", "empty value"),
        ("", "long-form option"),
    ],
)
def test_malformed_entries(entry: str, problem: str) -> None:
    error = _problem([entry])
    assert problem in str(error)
    assert error.value == entry


def test_duplicates_are_rejected_by_option_name() -> None:
    error = _problem(["--begin=now", "--overcommit", "--begin=now+1hour"])
    assert error.field == "extra_sbatch_directives[2]"
    assert "repeats --begin from extra_sbatch_directives[0]" in str(error)
    assert "repeats --overcommit" in str(_problem(["--overcommit", "--overcommit"]))


def test_duplicate_time_is_reported_as_managed() -> None:
    error = _problem(["--time=1", "--time"])
    assert error.field == "extra_sbatch_directives[0]"
    assert "time_limit" in str(error)


def test_custom_field_name_appears_in_the_error() -> None:
    assert _problem(["--wrap=x"], field="extra_directives").field == "extra_directives[0]"


def test_a_single_string_is_not_a_list() -> None:
    error = _problem("--overcommit")  # type: ignore[arg-type]
    assert "not one string" in str(error)


def test_non_string_entries() -> None:
    with pytest.raises(ConfigurationError, match="must be a string"):
        validate_extra_sbatch_directives([3])  # type: ignore[list-item]


def test_option_name() -> None:
    assert option_name("--begin=now") == "begin"
    assert option_name("--requeue") == "requeue"
    assert option_name("-t") is None
