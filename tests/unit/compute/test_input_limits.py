"""Input that cannot work on Linux is refused before anything is submitted: an environment
variable over 128 KiB, extra_env over 1 MiB together, an argument over 128 KiB, text without
a UTF-8 form. The errors name the field as the user spelled it, the size and the limit."""

from __future__ import annotations

import dagster as dg
import pytest
from pydantic import ValidationError

from dagster_slurm import ComputeResource
from dagster_slurm.compute.options import sbatch_overrides
from dagster_slurm.errors import MESSAGE_VALUE_LIMIT, ConfigurationError, shown_value
from dagster_slurm.launchers.base import PLAN_ENV_LIMIT, ExecutionPlan, validate_env
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.slurm.exec_limits import (
    COMMAND_LIMIT,
    MAX_ARG_STRLEN,
    check_command,
)

#: The longest value of a variable named BIG that Linux accepts: "BIG=" + value + NUL.
LONGEST_BIG = MAX_ARG_STRLEN - len("BIG=") - 1


def test_one_variable_over_128_kib_is_refused_with_size_limit_and_advice() -> None:
    with pytest.raises(ConfigurationError) as caught:
        validate_env({"SMALL": "1", "BIG": "x" * 200 * 1024})
    error = caught.value
    assert error.field == "extra_env['BIG']"
    assert str(error) == (
        "extra_env['BIG']='" + "x" * 79 + "... (204800 characters): BIG=<value> takes 204805 "
        "bytes with its terminating NUL, over Linux's limit of 131072 bytes (128 KiB, "
        "MAX_ARG_STRLEN) for one environment variable: every program the job starts would "
        "fail with 'Argument list too long'; pass large data through a file instead: write it "
        "where the job can read it (the cluster's shared filesystem) and pass the file's path, "
        "or pass it in extras (they reach the payload in the Pipes context file, not in the "
        "environment)"
    )
    assert error.value == "x" * 200 * 1024  # the value itself is kept, only the text is cut


def test_the_limit_is_exact_and_counts_bytes_not_characters() -> None:
    assert validate_env({"BIG": "x" * LONGEST_BIG})
    with pytest.raises(ConfigurationError, match="takes 131073 bytes"):
        validate_env({"BIG": "x" * (LONGEST_BIG + 1)})
    # "é" is two bytes of UTF-8: half as many characters already reach the limit
    with pytest.raises(ConfigurationError, match=r"extra_env\['BIG'\]"):
        validate_env({"BIG": "é" * (LONGEST_BIG // 2 + 1)})


def test_all_variables_together_over_1_mib_are_refused() -> None:
    env = {f"PART{i}": "y" * 100_000 for i in range(11)}  # each fine, 1.1 MB together
    with pytest.raises(ConfigurationError) as caught:
        validate_env(env)
    error = caught.value
    assert error.field == "extra_env"
    assert "the 11 variables take 1100078 bytes together (NAME=value and a NUL each), " \
           "over the 1048576 bytes (1 MiB) dagster-slurm allows for extra_env" in str(error)
    assert "ARG_MAX" in error.problem and "through a file" in error.problem
    assert len(str(error)) < 1000
    assert validate_env({f"PART{i}": "y" * 100_000 for i in range(10)})  # 1.0 MB passes


def test_text_without_a_utf8_form_and_nul_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="character 2 is a lone surrogate") as caught:
        validate_env({"RAW": "a\udcff"})
    assert caught.value.field == "extra_env['RAW']"
    with pytest.raises(ConfigurationError, match="NUL"):
        validate_env({"RAW": "a\0b"})


def test_a_plan_leaves_room_for_the_librarys_own_variables() -> None:
    env = {f"PART{i}": "y" * 100_000 for i in range(10)}
    env["DAGSTER_PIPES_CONTEXT"] = "z" * 1000
    plan = ExecutionPlan(payload=("python",), job_dir="/j", status_file="/j/s",
                         drain_file="/j/d", mode="slurm", env=env)
    assert len(plan.env) == 11
    more = {f"MORE{i}": "w" * 100_000 for i in range(2)}  # past the 64 KiB of room
    with pytest.raises(ConfigurationError, match=f"over the {PLAN_ENV_LIMIT} bytes") as caught:
        ExecutionPlan(payload=("python",), job_dir="/j", status_file="/j/s", drain_file="/j/d",
                      mode="slurm", env={**env, **more})
    assert caught.value.field == "env"
    with pytest.raises(ConfigurationError, match="word 2 of 2 of the command") as caught:
        ExecutionPlan(payload=("python", "a" * MAX_ARG_STRLEN), job_dir="/j",
                      status_file="/j/s", drain_file="/j/d", mode="slurm")
    assert caught.value.field == "payload"


def test_payload_command_words_and_total_are_limited() -> None:
    check_command("payload_path", "python -m tool --x " + "1" * 1000)
    with pytest.raises(ConfigurationError) as caught:
        check_command("payload_path", "python x.py '" + "a" * MAX_ARG_STRLEN + "'")
    assert caught.value.field == "payload_path"
    assert "word 3 of 3 of the command takes 131073 bytes" in str(caught.value)
    many = "python x.py " + " ".join(["b" * 100_000] * 3)
    with pytest.raises(ConfigurationError, match=f"over the {COMMAND_LIMIT} bytes"):
        check_command("payload_path", many)


def test_extra_slurm_opts_and_ray_start_args_are_limited_per_argument() -> None:
    with pytest.raises(ConfigurationError) as caught:
        sbatch_overrides({"extra_sbatch_directives": ["--comment=" + "c" * MAX_ARG_STRLEN]})
    assert caught.value.field == "extra_slurm_opts['extra_sbatch_directives']"
    assert "for one argument" in str(caught.value)
    with pytest.raises(ValidationError, match=r"ray_start_args\[0\]=.*for one argument"):
        RayLauncher(ray_start_args=["--labels=" + "l" * MAX_ARG_STRLEN])


def test_long_values_are_cut_in_every_configuration_message() -> None:
    assert shown_value("short") == "'short'"
    shown = shown_value("v" * 5000)
    assert len(shown) < MESSAGE_VALUE_LIMIT and shown.endswith("... (5000 characters)")
    assert shown_value(list(range(1000))).endswith("characters as text)")


# -- nothing is submitted ------------------------------------------------------------------


class TransportUsed(Exception):
    """Raised by the fake connection: something tried to reach the cluster."""


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every attempt to open the cluster connection is recorded and stopped."""
    calls: list[str] = []

    def get_transport(self: SSHConnectionResource) -> None:
        calls.append(self.host)
        raise TransportUsed(self.host)

    monkeypatch.setattr(SSHConnectionResource, "get_transport", get_transport)
    return calls


def _compute(scope: str) -> ComputeResource:
    ssh = SSHConnectionResource(host="login.invalid", user="me")
    return ComputeResource(mode="slurm", slurm=SlurmResource(ssh=ssh, remote_base="/base"),
                           allocation_scope=scope)


@pytest.mark.parametrize("scope", ["asset", "run"])
def test_an_oversized_variable_is_refused_before_the_cluster_is_contacted(
        no_cluster: list[str], scope: str) -> None:
    compute = _compute(scope)
    with pytest.raises(ConfigurationError, match=r"^extra_env\['BIG'\]=.*128 KiB"):
        compute.run(context=None, payload_path="python -m tool",
                    extra_env={"BIG": "x" * 200 * 1024})
    with pytest.raises(ConfigurationError, match="word 3 of 3"):
        compute.run(context=None, payload_path="python -m " + "m" * MAX_ARG_STRLEN)
    assert no_cluster == []


def test_a_large_value_within_the_limit_goes_on_to_the_cluster(no_cluster: list[str]) -> None:
    @dg.asset
    def tool(context):
        with pytest.raises(TransportUsed):
            _compute("asset").run(context=context, payload_path="python -m tool",
                                  extra_env={"BIG": "x" * LONGEST_BIG})
        return dg.MaterializeResult()

    assert dg.materialize([tool]).success
    assert no_cluster == ["login.invalid"]
