"""Names of the published dagster-slurm 1.x package are accepted for today's fields.

Each published name moves its value to the field of today's name with a DeprecationWarning
naming that field; giving both names is an error naming both; an invalid value is refused
with the new field's message under the name as the user wrote it; the old names stay out of
the field lists (and so out of the configuration reference and Dagster's config schema).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from dagster_slurm import (
    ConfigurationError,
    RayLauncher,
    SlurmResource,
    SlurmRunAllocationConfig,
    SlurmSessionResource,
    SSHConnectionResource,
    build_slurm_orphan_reconcile_sensor,
)
from dagster_slurm.config_errors import UnknownFieldError
from dagster_slurm.session.core.allocation import SlurmAllocation
from dagster_slurm.session.frontend.resource import FLAT_ALLOCATION_FIELDS


def _ssh(**kwargs: Any) -> SSHConnectionResource:
    return SSHConnectionResource(host="login.example", user="alice", **kwargs)


def _slurm() -> SlurmResource:
    return SlurmResource(ssh=_ssh(), remote_base="/shared/dagster-slurm")


def _cause(error: ValidationError) -> Exception:
    (cause,) = [e["ctx"]["error"] for e in error.errors()]
    return cause


# -- keyword aliases: (build with old name, old, new name, how to read the new field, expected) --

ALIASES: dict[str, tuple[Callable[..., Any], str, str, Callable[[Any], Any], object, object]] = {
    # name: (build(**kw), old keyword, new name in the warning, read the new field, given, stored)
    "known_hosts_file": (
        _ssh, "known_hosts_file", "known_hosts_path", lambda r: r.known_hosts_path,
        "/etc/ssh/cluster_known_hosts", "/etc/ssh/cluster_known_hosts",
    ),
    "object_store_memory_gb": (
        RayLauncher, "object_store_memory_gb", "object_store_memory",
        lambda r: r.object_store_memory, 2, 2_000_000_000,
    ),
    "head_startup_timeout": (
        RayLauncher, "head_startup_timeout", "startup_timeout", lambda r: r.startup_timeout,
        45, 45.0,
    ),
    **{
        f"session {name}": (
            lambda **kw: SlurmSessionResource(slurm=_slurm(), **kw), name,
            f"run_allocation.{name}", lambda r, name=name: getattr(r.run_allocation, name),
            value, value,
        )
        for name, value in {
            "time_limit": "01:00:00", "partition": "batch", "qos": "normal", "account": "proj",
            "reservation": "res1", "mem": "8G", "mem_per_cpu": "2G", "cpus_per_task": 4,
            "gpus_per_node": 1, "signal_before_timeout": "USR1@120", "nodelist": "gpu-[01-02]",
        }.items()
    },
}

#: Same aliases with an invalid value and a text of the error of the new field.
INVALID: dict[str, tuple[object, str]] = {
    "known_hosts_file": (5, "valid string"),
    "object_store_memory_gb": (0, "Ray needs at least"),
    "head_startup_timeout": (-5, "must be a positive number of seconds"),
    "session time_limit": ("soon", "is not a Slurm time"),
    "session cpus_per_task": (0, "must be at least 1"),
    "session partition": ("bad name!", "partition"),
    "session mem": ("lots", "mem"),
}

#: The value of the new field given alongside the alias, as keyword arguments.
BOTH: dict[str, dict[str, Any]] = {
    "known_hosts_file": {"known_hosts_path": "/other"},
    "object_store_memory_gb": {"object_store_memory": 100_000_000},
    "head_startup_timeout": {"startup_timeout": 30},
    "session time_limit": {"run_allocation": {"time_limit": "02:00:00"}},
    "session partition": {"run_allocation": SlurmRunAllocationConfig(partition="other")},
}


def test_every_flat_session_field_has_a_test() -> None:
    assert {f"session {name}" for name in FLAT_ALLOCATION_FIELDS} <= set(ALIASES)


@pytest.mark.parametrize("case", sorted(ALIASES))
def test_published_name_sets_the_new_field_with_a_warning_naming_it(case: str) -> None:
    build, old, new, read, given, stored = ALIASES[case]
    with pytest.warns(DeprecationWarning, match=rf"{old}=.*use {new}\b") as caught:
        resource = build(**{old: given})
    assert read(resource) == stored
    (warning,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert warning.filename == __file__, "the warning points at the user's line"


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_value_under_a_published_name_is_refused_naming_that_name(case: str) -> None:
    build, old, _new, _read, _given, _stored = ALIASES[case]
    value, text = INVALID[case]
    with pytest.warns(DeprecationWarning), pytest.raises(ValidationError) as caught:
        build(**{old: value})
    cause = _cause(caught.value)
    assert isinstance(cause, ConfigurationError)
    assert (cause.field, cause.value) == (old, value)
    assert str(cause).startswith(f"{old}={value!r}: ") and text in str(cause)


@pytest.mark.parametrize("case", sorted(BOTH))
def test_published_name_and_new_name_together_are_an_error_naming_both(case: str) -> None:
    build, old, new, _read, given, _stored = ALIASES[case]
    with pytest.warns(DeprecationWarning), pytest.raises(ValidationError) as caught:
        build(**{old: given}, **BOTH[case])
    cause = _cause(caught.value)
    assert isinstance(cause, ConfigurationError) and cause.field == old
    assert f"{old}=" in str(cause) and new in str(cause) and "set only" in str(cause)


def test_flat_session_fields_merge_into_a_given_run_allocation() -> None:
    with pytest.warns(DeprecationWarning, match="run_allocation.time_limit"):
        session = SlurmSessionResource(
            slurm=_slurm(), num_nodes=2, time_limit="01:00:00",
            run_allocation=SlurmRunAllocationConfig(qos="normal"),
        )
    assert (session.run_allocation.time_limit, session.run_allocation.qos) == ("01:00:00", "normal")
    assert session.num_nodes == 2  # a field of its own here too: no warning for it


def test_object_store_memory_gb_must_be_a_number() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ValidationError) as caught:
        RayLauncher(object_store_memory_gb="4G")
    assert "object_store_memory_gb='4G': must be a number of gigabytes" in str(caught.value)
    with pytest.warns(DeprecationWarning):
        assert RayLauncher(object_store_memory_gb=None).object_store_memory is None


@pytest.mark.parametrize("cls, old", [
    (SSHConnectionResource, "known_hosts_file"), (RayLauncher, "object_store_memory_gb"),
    (RayLauncher, "head_startup_timeout"), (SlurmSessionResource, "time_limit"),
])
def test_published_names_are_not_fields(cls: type, old: str) -> None:
    assert old not in cls.model_fields


def test_unknown_names_stay_errors_next_to_published_ones() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ValidationError) as caught:
        RayLauncher(head_startup_timeout=30, grace_period=5)
    cause = _cause(caught.value)
    assert isinstance(cause, UnknownFieldError) and cause.field == "grace_period"


def test_no_warning_without_published_names() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        RayLauncher(startup_timeout=30, object_store_memory=100_000_000)
        SlurmSessionResource(slurm=_slurm(), num_nodes=2)


# -- SlurmAllocation.slurm_job_id ----------------------------------------------------------------


def test_slurm_job_id_reads_job_id_with_a_warning() -> None:
    allocation = SlurmAllocation(None, None, "dsr-run", "4242")  # type: ignore[arg-type]
    with pytest.warns(DeprecationWarning, match=r"SlurmAllocation\.slurm_job_id.*use SlurmAllocation\.job_id"):
        assert allocation.slurm_job_id == "4242"


# -- build_slurm_orphan_reconcile_sensor(slurm_resource=...) -------------------------------------


def test_orphan_sensor_accepts_slurm_resource_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"slurm_resource=.*use slurm="):
        sensor = build_slurm_orphan_reconcile_sensor(slurm_resource=_slurm())
    assert sensor.name == "slurm_orphan_reconcile_sensor"


def test_orphan_sensor_refuses_slurm_and_slurm_resource_together() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigurationError) as caught:
        build_slurm_orphan_reconcile_sensor(_slurm(), slurm_resource=_slurm())
    assert caught.value.field == "slurm_resource" and "slurm" in caught.value.problem


# -- SlurmResource.from_env with the published variables ----------------------------------------

PUBLISHED_ENV = {
    "SLURM_SSH_HOST": "login.example", "SLURM_SSH_USER": "alice", "SLURM_SSH_PORT": "2222",
    "SLURM_SSH_KEY": "/keys/id", "SLURM_SSH_KNOWN_HOSTS_FILE": "/etc/kh",
    "SLURM_REMOTE_BASE": "/shared/base", "SLURM_PARTITION": "batch", "SLURM_TIME": "01:00:00",
    "SLURM_CPUS": "4", "SLURM_MEM": "8G", "SLURM_NUM_NODES": "2", "SLURM_GPUS_PER_NODE": "1",
    "SLURM_QOS": "normal", "SLURM_RESERVATION": "res1", "SLURM_ACCOUNT": "proj",
    "SLURM_SIGNAL_BEFORE_TIMEOUT": "USR1@120",
}


def _from_env(env: dict[str, str]) -> SlurmResource:
    return SlurmResource.from_env(environ=env)


def test_from_env_reads_the_published_variables() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        resource = _from_env(PUBLISHED_ENV)
    messages = " | ".join(str(w.message) for w in caught)
    for new in ("SLURM_EDGE_NODE_ ", "SLURM_EDGE_NODE_KNOWN_HOSTS ", "SLURM_DEPLOYMENT_BASE_PATH "):
        assert f"use {new}" in messages
    ssh, queue = resource.ssh, resource.queue
    assert (ssh.host, ssh.user, ssh.port, ssh.key_path, ssh.known_hosts_path) == (
        "login.example", "alice", 2222, "/keys/id", "/etc/kh")
    assert resource.remote_base == "/shared/base"
    assert (queue.partition, queue.time_limit, queue.cpus, queue.mem, queue.num_nodes,
            queue.gpus_per_node, queue.qos, queue.reservation, queue.account,
            queue.signal_before_timeout) == (
        "batch", "01:00:00", 4, "8G", 2, 1, "normal", "res1", "proj", "USR1@120")


def test_from_env_prefers_our_names_and_reads_queue_variables_without_warning() -> None:
    env = {"SLURM_EDGE_NODE_HOST": "login.example", "SLURM_EDGE_NODE_USER": "alice",
           "SLURM_DEPLOYMENT_BASE_PATH": "/shared/base", "SLURM_TIME": "00:10:00"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resource = _from_env(env)
    assert resource.queue.time_limit == "00:10:00"


@pytest.mark.parametrize("extra, old, new", [
    ({"SLURM_EDGE_NODE_HOST": "other"}, "SLURM_SSH_HOST", "SLURM_EDGE_NODE_HOST"),
    ({"SLURM_DEPLOYMENT_BASE_PATH": "/x"}, "SLURM_REMOTE_BASE", "SLURM_DEPLOYMENT_BASE_PATH"),
    ({"SLURM_SSH_KNOWN_HOSTS": "/x"}, "SLURM_SSH_KNOWN_HOSTS_FILE", "SLURM_SSH_KNOWN_HOSTS"),
])
def test_from_env_refuses_a_published_variable_next_to_ours(extra, old, new) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigurationError) as caught:
            _from_env({**PUBLISHED_ENV, **extra})
    assert caught.value.field == old and new in caught.value.problem


@pytest.mark.parametrize("name, value, text", [
    ("SLURM_TIME", "soon", "is not a Slurm time"),
    ("SLURM_CPUS", "four", "whole number"),
    ("SLURM_MEM", "lots", ""),
    ("SLURM_REMOTE_BASE", "dagster_runs", "absolute path"),
])
def test_from_env_names_the_variable_of_a_bad_value(name: str, value: str, text: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigurationError) as caught:
            _from_env({**PUBLISHED_ENV, name: value})
    assert (caught.value.field, caught.value.value) == (name, value)
    assert text in caught.value.problem


def test_from_env_inside_a_job_skips_what_slurm_sets_for_the_job() -> None:
    env = {**PUBLISHED_ENV, "SLURM_JOB_ID": "77", "SLURM_MEM_PER_CPU": "1G",
           "SLURM_GPUS_PER_NODE": "4"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        queue = _from_env(env).queue
    assert (queue.mem_per_cpu, queue.gpus_per_node) == (None, 0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_from_env_warns_about_published_ssh_variables_it_cannot_honour() -> None:
    with pytest.warns(UserWarning, match="SLURM_SSH_FORCE_TTY='true' is ignored"):
        _from_env({**PUBLISHED_ENV, "SLURM_SSH_FORCE_TTY": "true"})


def test_ssh_from_env_with_the_published_prefix_reads_its_renamed_variables() -> None:
    env = {"SLURM_SSH_HOST": "login.example", "SLURM_SSH_USER": "alice",
           "SLURM_SSH_KNOWN_HOSTS_FILE": "/etc/kh", "SLURM_SSH_JUMP_HOST": "bastion.example",
           "SLURM_SSH_JUMP_KEY": "/keys/jump"}
    with pytest.warns(DeprecationWarning) as caught:
        ssh = SSHConnectionResource.from_env(prefix="SLURM_SSH", environ=env)
    assert (ssh.known_hosts_path, ssh.jump_host.host, ssh.jump_host.key_path) == (
        "/etc/kh", "bastion.example", "/keys/jump")
    texts = " | ".join(str(w.message) for w in caught)
    assert "use SLURM_SSH_KNOWN_HOSTS " in texts and "use SLURM_SSH_JUMP_KEY_PATH " in texts
