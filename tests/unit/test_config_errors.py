"""Configuration mistakes fail when the configuration is written, in the user's words.

Unknown names are refused with the closest real name as a suggestion, on every resource and
configuration class, whether built directly, nested as a dictionary or by Dagster from run
config; values of SlurmRunAllocationConfig, extra_slurm_opts, extras and
RayLauncher.ray_start_args are checked before anything is started or submitted.
"""

import select
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pydantic import ValidationError

from dagster_slurm import (
    BashLauncher,
    ComputeResource,
    ConfigurationError,
    RayLauncher,
    RayPortConfig,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
    SlurmSessionResource,
    SSHConnectionResource,
)
from dagster_slurm.compute.options import sbatch_overrides, validate_extras
from dagster_slurm.config_errors import UnknownFieldError, closest_name, unknown_name_problem
from dagster_slurm.environment import EnvironmentConfig


def _ssh(**kwargs: Any) -> SSHConnectionResource:
    return SSHConnectionResource(host="login.example", user="alice", **kwargs)


def _slurm(**kwargs: Any) -> SlurmResource:
    return SlurmResource(ssh=_ssh(), remote_base="/shared/dagster-slurm", **kwargs)


# -- unknown names -------------------------------------------------------------------------------

UNKNOWN: dict[str, tuple[Callable[[], object], str, str]] = {
    "ComputeResource": (lambda: ComputeResource(mdoe="slurm"), "mdoe", "mode"),
    "SlurmResource": (lambda: _slurm(remote_bsae="/x"), "remote_bsae", "remote_base"),
    "SSHConnectionResource": (lambda: _ssh(prot=2222), "prot", "port"),
    "SlurmSessionResource": (
        lambda: SlurmSessionResource(slurm=_slurm(), run_alocation={}),
        "run_alocation",
        "run_allocation",
    ),
    "SlurmQueueConfig": (lambda: SlurmQueueConfig(cpu=4), "cpu", "cpus"),
    "SlurmRunAllocationConfig": (lambda: SlurmRunAllocationConfig(nodes=2), "nodes", "num_nodes"),
    "RayPortConfig": (lambda: RayPortConfig(range_strat=20000), "range_strat", "range_start"),
    "EnvironmentConfig": (
        lambda: EnvironmentConfig(env_pakages=["numpy"]), "env_pakages", "env_packages"
    ),
    "BashLauncher": (
        lambda: BashLauncher(pre_start_command=["module load x"]),
        "pre_start_command",
        "pre_start_commands",
    ),
    "RayLauncher": (lambda: RayLauncher(num_cpus=4), "num_cpus", "num_cpus_per_node"),
}


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_unknown_field_is_refused_naming_it_and_the_closest_field(name: str) -> None:
    build, wrong, right = UNKNOWN[name]
    with pytest.raises(ValidationError) as caught:
        build()
    text = str(caught.value)
    assert f"unknown field {wrong!r}; did you mean {right!r}?" in text
    assert name in text
    (cause,) = [e["ctx"]["error"] for e in caught.value.errors()]
    assert isinstance(cause, UnknownFieldError) and isinstance(cause, ConfigurationError)
    assert (cause.field, cause.suggestion) == (wrong, right)


def test_unknown_field_in_a_nested_dictionary_names_its_place() -> None:
    with pytest.raises(ValidationError) as caught:
        ComputeResource(allocation_scope="run", run_allocation={"nodes": 2})
    text = str(caught.value)
    assert "run_allocation" in text
    assert "SlurmRunAllocationConfig: unknown field 'nodes'; did you mean 'num_nodes'?" in text


def test_unknown_field_without_a_close_name_lists_the_fields() -> None:
    with pytest.raises(ValidationError) as caught:
        SlurmQueueConfig(zzzz=1)
    assert "unknown field 'zzzz'; the fields are account, array_parallelism, cpus, extra_sbatch_directives" in str(
        caught.value
    )


def test_suggestions() -> None:
    assert closest_name("mdoe", ["mode", "slurm"]) == "mode"
    assert closest_name("Mode", ["mode"]) == "mode"
    assert closest_name("qqqq", ["mode", "slurm"]) is None
    assert unknown_name_problem("gpu", ["gres"], what="option") == (
        "unknown option 'gpu'; the options are gres"
    )


def test_constructors_and_nested_instances_still_work() -> None:
    environ = {"X_HOST": "login.example", "X_USER": "alice", "X_PORT": "2222", "X_KEY": "/k"}
    ssh = SSHConnectionResource.from_env(prefix="X", environ=environ)
    assert (ssh.port, ssh.key_path) == (2222, "/k")
    slurm = SlurmResource.from_env(prefix="X", environ={**environ, "SLURM_PARTITION": "gpu"})
    assert slurm.queue.partition == "gpu"
    compute = ComputeResource(
        mode="slurm", slurm=slurm, allocation_scope="run",
        run_allocation={"num_nodes": 2}, default_launcher=RayLauncher(),
    )
    assert compute.run_allocation is not None and compute.run_allocation.num_nodes == 2


def test_unknown_key_in_run_config_is_refused_by_dagster_naming_it(tmp_path: Path) -> None:
    @dg.asset
    def thing(compute: ComputeResource) -> None:
        raise AssertionError("must not run")

    run_config = {"resources": {"compute": {"config": {"mdoe": "slurm"}}}}
    with pytest.raises(dg.DagsterInvalidConfigError) as caught:
        dg.materialize([thing], resources={"compute": ComputeResource()}, run_config=run_config)
    assert 'unexpected config entry "mdoe"' in str(caught.value)
    assert "root:resources:compute:config" in str(caught.value)


def test_dagster_rebuilds_strict_resources_from_run_config(tmp_path: Path) -> None:
    # Dagster builds the resources again from their values plus run config, nested
    # resources included: the strict fields must accept everything Dagster passes.
    @dg.asset
    def thing(compute: ComputeResource) -> dict:
        return {
            "poll": compute.pipes_poll_interval,
            "partition": compute.slurm.queue.partition if compute.slurm else None,
            "nodes": compute.run_allocation.num_nodes if compute.run_allocation else None,
        }

    compute = ComputeResource(mode="slurm", slurm=_slurm(), allocation_scope="run")
    # Run config for a resource replaces its configured values (Dagster's rule), so it
    # repeats the mode and scope; Dagster config names enum members (RUN).
    config = {"mode": "slurm", "allocation_scope": "RUN", "pipes_poll_interval": 0.5,
              "run_allocation": {"num_nodes": 3}}
    run_config = {"resources": {"compute": {"config": config}}}
    result = dg.materialize([thing], resources={"compute": compute}, run_config=run_config)
    assert result.output_for_node("thing") == {"poll": 0.5, "partition": None, "nodes": 3}


def test_bad_value_in_run_config_names_the_field_and_the_value() -> None:
    @dg.asset
    def thing(compute: ComputeResource) -> None:
        raise AssertionError("must not run")

    run_config = {
        "resources": {"compute": {"config": {"allocation_scope": "RUN",
                                             "run_allocation": {"cpus_per_task": -2}}}}
    }
    result = dg.materialize(
        [thing], resources={"compute": ComputeResource()}, run_config=run_config,
        raise_on_error=False,
    )
    assert not result.success
    text = "\n".join(
        str(event.event_specific_data.error.to_string())
        for event in result.all_events
        if event.is_failure and getattr(event.event_specific_data, "error", None) is not None
    )
    assert "cpus_per_task=-2: must be at least 1" in text


# -- SlurmRunAllocationConfig values, in its own field names ------------------------------------------


def test_allocation_values_are_checked_when_it_is_built_in_its_own_words() -> None:
    with pytest.raises(ValidationError) as caught:
        SlurmRunAllocationConfig(
            num_nodes=0, cpus_per_task=-2, time_limit="abc", partition="gpu;reboot"
        )
    text = str(caught.value)
    assert "for SlurmRunAllocationConfig" in text and "SlurmQueueConfig" not in text
    for fragment in ("num_nodes=0", "cpus_per_task=-2", "time_limit='abc'",
                     "partition='gpu;reboot'"):
        assert fragment in text
    assert "cpus=" not in text


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"gpus_per_node": -1}, "gpus_per_node=-1"),
        ({"mem": "4 GB"}, "mem='4 GB'"),
        ({"mem_per_cpu": "x"}, "mem_per_cpu='x'"),
        ({"time_min": "soon"}, "time_min='soon'"),
        ({"qos": "a b"}, "qos='a b'"),
        ({"account": "x;y"}, "account='x;y'"),
        ({"reservation": "$r"}, "reservation='$r'"),
        ({"signal_before_timeout": "KILL@60"}, "signal_before_timeout='KILL@60'"),
        ({"signal_before_timeout": "B:USR1@60"}, "without a prefix"),
        ({"extra_sbatch_directives": ["--wrap=id"]}, "extra_sbatch_directives[0]='--wrap=id'"),
    ],
)
def test_each_allocation_value_is_checked_when_built(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        SlurmRunAllocationConfig(**kwargs)
    assert fragment in str(caught.value)


def test_directive_advice_names_the_allocation_field() -> None:
    with pytest.raises(ValidationError) as caught:
        SlurmRunAllocationConfig(extra_sbatch_directives=["--cpus-per-task=4"])
    assert "use the first-class field cpus_per_task" in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        SlurmQueueConfig(extra_sbatch_directives=["--cpus-per-task=4"])
    assert "use the first-class field cpus " in str(caught.value) + " "


def test_combination_with_the_queue_names_the_allocation_field() -> None:
    config = SlurmRunAllocationConfig(time_min="01:00:00")
    with pytest.raises(ConfigurationError) as caught:
        config.queue_for(SlurmQueueConfig(time_limit="00:30:00"))
    assert caught.value.field == "time_min"
    assert "must not exceed time_limit='00:30:00'" in str(caught.value)
    assert "queue configuration" in str(caught.value)


@pytest.mark.parametrize(
    ("opts", "field"),
    [
        ({"cpus": -1}, "extra_slurm_opts['cpus']"),
        ({"nodes": 0}, "extra_slurm_opts['nodes']"),
        ({"time": "tomorrow"}, "extra_slurm_opts['time']"),
        ({"extra_sbatch_directives": ["-t 5"]}, "extra_slurm_opts['extra_sbatch_directives'][0]"),
        ({"mem": "8G", "mem_per_cpu": "1G"}, "extra_slurm_opts['mem_per_cpu']"),
    ],
)
def test_extra_slurm_opts_errors_use_the_key_the_user_wrote(opts: dict, field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        sbatch_overrides(opts)
    assert caught.value.field == field
    assert "cpus_per_task" not in str(caught.value) and "extra_directives" not in str(caught.value)


def test_unknown_extra_slurm_opts_key_gets_a_suggestion() -> None:
    with pytest.raises(ConfigurationError, match="unknown option 'cpu'; did you mean 'cpus'"):
        sbatch_overrides({"cpu": 2})


def test_run_allocation_with_asset_scope_is_an_error() -> None:
    with pytest.raises(ValidationError) as caught:
        ComputeResource(mode="slurm", slurm=_slurm(),
                        run_allocation=SlurmRunAllocationConfig(num_nodes=2))
    text = str(caught.value)
    assert "run_allocation={'num_nodes': 2}" in text and "allocation_scope='run'" in text
    with pytest.raises(ValidationError, match="run_allocation"):
        ComputeResource(allocation_scope="asset", run_allocation={})
    ComputeResource(mode="slurm", slurm=_slurm(), allocation_scope="run",
                    run_allocation=SlurmRunAllocationConfig(num_nodes=2))


# -- extras ---------------------------------------------------------------------------------------


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


@pytest.mark.parametrize(
    ("extras", "field"),
    [
        ({"ok": 1, "when": _Opaque()}, "extras['when']"),
        ({"nested": {"a": [1, {2, 3}]}}, "extras['nested']"),
        ({"data": b"bytes"}, "extras['data']"),
        ({1: "x"}, "extras"),
        ([("a", 1)], "extras"),
    ],
)
def test_non_json_extras_are_refused_naming_the_key(extras: Any, field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        validate_extras(extras)
    assert caught.value.field == field


def test_json_extras_pass() -> None:
    validate_extras(None)
    validate_extras({"a": 1, "b": [1.5, None, True], "c": {"d": "e"}})


def _failure_text(result: dg.ExecuteInProcessResult) -> str:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "the step must fail"
    error = failures[0].step_failure_data.error
    return f"{error.cause.cls_name}: {error.cause.message}" if error.cause else error.message


def _asset_with_extras(payload: Path, extras: dict):
    @dg.asset
    def thing(context: dg.AssetExecutionContext, compute: ComputeResource):
        yield from compute.run(context=context, payload_path=str(payload), extras=extras).get_results()

    return thing


def test_non_json_extras_fail_in_local_mode_leaving_nothing_behind(tmp_path: Path) -> None:
    payload = tmp_path / "payload.py"
    payload.write_text("raise SystemExit('must not run')\n")
    base = tmp_path / "base"
    resource = ComputeResource(mode="local", local_base_path=str(base))
    result = dg.materialize(
        [_asset_with_extras(payload, {"rows": 3, "when": _Opaque()})],
        resources={"compute": resource}, raise_on_error=False,
    )
    text = _failure_text(result)
    assert "ConfigurationError" in text and "extras['when']=<opaque>" in text
    assert "JSON" in text
    assert not base.exists() or not any(base.rglob("*")), "no invocation directory is left"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP port that records whether anyone connected (nobody accepts)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield server
    finally:
        server.close()


def _was_contacted(server: socket.socket) -> bool:
    readable, _, _ = select.select([server], [], [], 0)
    return bool(readable)


@pytest.mark.parametrize("scope", ["asset", "run"])
def test_non_json_extras_fail_in_slurm_mode_before_the_cluster_is_contacted(
    tmp_path: Path, listener: socket.socket, scope: str
) -> None:
    payload = tmp_path / "payload.py"
    payload.write_text("raise SystemExit('must not run')\n")
    port = listener.getsockname()[1]
    ssh = SSHConnectionResource(host="127.0.0.1", port=port, user="nobody", connect_timeout=2)
    resource = ComputeResource(
        mode="slurm", slurm=SlurmResource(ssh=ssh, remote_base="/nonexistent/base"),
        allocation_scope=scope, pre_deployed_env_path="/nonexistent/env",
    )
    result = dg.materialize(
        [_asset_with_extras(payload, {"path": tmp_path})],
        resources={"compute": resource}, raise_on_error=False,
    )
    text = _failure_text(result)
    assert "ConfigurationError" in text and "extras['path']" in text
    assert not _was_contacted(listener), "the login node must not be contacted"


# -- RayLauncher.ray_start_args ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        (["--labels a=b"], "ray_start_args[0]='--labels a=b': must not contain whitespace"),
        (["--log-style=record --block"], "one option per entry"),
        (["--x='a'"], "must not contain quotes"),
        (["--x=a\\b"], "backslashes"),
        (["--x=`id`"], "ray_start_args[0]"),
        (["--x=a\nb"], "control characters"),
        (["-v"], "only long-form options"),
        (["$(reboot)"], "must be one long-form option"),
        (["--log-style=record", "--log-style=json"], "repeats --log-style from ray_start_args[0]"),
        (["--num-cpus=4"], "use num_cpus_per_node"),
        (["--port=6379"], "use ray_port"),
        (["--resources=x"], "is set by the launcher"),
        (["--min-worker-port=1"], "port_config"),
        (["--x="], "empty value"),
    ],
)
def test_bad_ray_start_args_are_refused_naming_the_entry(entries: list[str], fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RayLauncher(ray_start_args=entries)
    assert fragment in str(caught.value)


def test_good_ray_start_args_are_kept_in_order() -> None:
    entries = ["--log-style=record", "--labels=zone=a,rack=b", "--storage=/shared/ray", "--verbose"]
    assert RayLauncher(ray_start_args=entries).ray_start_args == entries


def test_sbatch_directive_messages_are_unchanged() -> None:
    with pytest.raises(ValidationError, match="looks like an abbreviation of --partition, which sbatch"):
        SlurmQueueConfig(extra_sbatch_directives=["--part=gpu"])


def test_every_unknown_field_of_one_call_is_named() -> None:
    with pytest.raises(ValidationError) as caught:
        ComputeResource(slrum=None, mdoe="slurm")
    assert "unknown field 'mdoe'; did you mean 'mode'? (also unknown: 'slrum')" in str(caught.value)
