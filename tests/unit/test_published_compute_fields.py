"""``ComputeResource`` as the published example builds it: ``session=None`` builds with a
deprecation warning (and is not part of the configuration Dagster records); each published
field without an equivalent, ``session=<a session>`` and the published modes fail saying
what to write instead."""

import warnings
from enum import Enum

import dagster as dg
import pytest
from pydantic import ValidationError

from dagster_slurm import (
    ComputeResource,
    ConfigurationError,
    SlurmResource,
    SlurmSessionResource,
    SSHConnectionResource,
)
from dagster_slurm.compute.published_fields import WITHDRAWN_FIELDS
from dagster_slurm.config_errors import WithdrawnFieldError


def test_session_none_builds_with_a_warning_and_is_not_recorded() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        compute = ComputeResource(mode="local", session=None)
    (warning,) = [w for w in caught if "session" in str(w.message)]
    assert "ComputeResource(session=None) comes from the published dagster-slurm package; " \
           "leave it out" in str(warning.message)
    assert warning.filename == __file__, "the warning points at the user's line"
    seen = []

    @dg.asset
    def uses_compute(compute: ComputeResource) -> None:
        seen.append(compute.mode)

    assert dg.materialize([uses_compute], resources={"compute": compute}).success
    assert seen == ["local"], "Dagster rebuilds the resource without the dropped keyword"


def _refusal(**kwargs: object) -> WithdrawnFieldError:
    with pytest.raises(ValidationError) as caught:
        ComputeResource(**kwargs)
    cause = caught.value.errors()[0]["ctx"]["error"]
    assert isinstance(cause, WithdrawnFieldError) and isinstance(cause, ConfigurationError)
    return cause


@pytest.mark.parametrize("field", [w for w in WITHDRAWN_FIELDS if w.name != "session"],
                         ids=lambda w: w.name)
def test_each_published_field_says_what_to_write_instead(field) -> None:
    cause = _refusal(mode="local", **{field.name: 1})
    assert (cause.field, cause.value) == (field.name, 1)
    assert f"{field.name}=1 is the published package's field, with no equivalent here: " \
           f"{field.advice(1)}" in str(cause)
    assert "remove " in field.advice(1).lower(), "each says what to do with the keyword"


def test_the_published_packing_fields_are_reported_together() -> None:
    published = {"pack_on_remote": True, "remote_pack_timeout": 600, "debug_mode": False,
                 "cache_inject_globs": ["src/**/*.py"], "pack_platform": "linux-64"}
    cause = _refusal(mode="slurm", auto_detect_platform=True, **published)
    assert [name for name, _, _ in cause.given] == sorted(published)
    text = str(cause)
    assert "pack_on_remote=True is the published package's field" in text
    assert "nothing is packed on the cluster; remove remote_pack_timeout" in text
    assert "pass defer_cleanup=True to compute.run. Remove debug_mode" in text
    assert "remove pack_platform and keep auto_detect_platform=True" in text


def test_a_session_resource_is_refused_with_the_run_scope_to_write() -> None:
    ssh = SSHConnectionResource(host="login.invalid", user="alice")
    slurm = SlurmResource(ssh=ssh, remote_base="/shared/x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        session = SlurmSessionResource(slurm=slurm, num_nodes=2, time_limit="01:00:00")
    cause = _refusal(mode="slurm", slurm=slurm, session=session)
    assert cause.field == "session"
    assert ("write mode='slurm', allocation_scope='run', run_allocation=SlurmRunAllocationConfig("
            "time_limit='01:00:00', num_nodes=2) and leave session out") in str(cause)


@pytest.mark.parametrize("mode, advice", [
    ("slurm-session", "is mode='slurm', allocation_scope='run' here"),
    ("slurm-hetjob", "compute.run_hetjob(context, components=[...], payload_path=...)"),
])
def test_the_published_modes_say_what_to_write(mode: str, advice: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ComputeResource(mode=mode)
    assert f"mode={mode!r}: " in str(caught.value) and advice in str(caught.value)


def test_a_string_enum_mode_is_read_by_its_value() -> None:
    class ExecutionMode(str, Enum):
        LOCAL = "local"
        SLURM_SESSION = "slurm-session"

    assert ComputeResource(mode=ExecutionMode.LOCAL).mode == "local"
    with pytest.raises(ValidationError, match="allocation_scope='run'"):
        ComputeResource(mode=ExecutionMode.SLURM_SESSION)
