from __future__ import annotations

import os
from pathlib import Path

import pytest

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.commands import (
    SACCT_FIELDS,
    SQUEUE_FIELDS,
    SQUEUE_FORMAT,
    SbatchSpec,
    sacct_argv,
    sbatch_argv,
    scancel_argv,
    scontrol_show_config_argv,
    scontrol_update_timelimit_argv,
    squeue_argv,
)
from dagster_slurm.slurm.hetjob import HetComponentSpec

GOLDEN_DIR = Path(__file__).parent / "golden"

GOLDEN_SPECS: dict[str, tuple[SbatchSpec, bool]] = {
    "minimal": (SbatchSpec(job_name="dg-minimal", script_path="/work/run/job.sh"), False),
    "cpu_full": (
        SbatchSpec(
            job_name="dg-run-7f3a",
            script_path="/home/u/pipelines/run-7f3a/job.sh",
            partition="cpu",
            qos="normal",
            account="proj-42",
            reservation="maint.window",
            time_limit="90",
            time_min="00:30:00",
            num_nodes=2,
            ntasks_per_node=1,
            cpus_per_task=2,
            mem="4096M",
            signal="B:USR1@60",
            comment="tok-abc123",
            output="/home/u/pipelines/run-7f3a/%j.out",
            error="/home/u/pipelines/run-7f3a/%j.err",
            chdir="/home/u/pipelines/run-7f3a",
            extra_directives=("--dependency=afterany:123", "--begin=now+1hour"),
        ),
        False,
    ),
    "gpu_test_only": (
        SbatchSpec(
            job_name="dg-gpu",
            script_path="/work/run/gpu job.sh",
            partition="gpu",
            time_limit="1-00:00:00",
            num_nodes=1,
            gpus_per_node=2,
            mem_per_cpu="2G",
            nodelist="g[1-2]",
            exclusive=True,
            hold=True,
            export="NONE",
            gres="gpu:2",
        ),
        True,
    ),
    "no_export": (
        SbatchSpec(job_name="dg-env", script_path="job.sh", export=None, time_limit="UNLIMITED"),
        False,
    ),
    "array": (
        SbatchSpec(
            job_name="dg-arr-7f3a",
            script_path="/home/u/pipelines/run-7f3a/dagster_slurm_array_0.sh",
            partition="cpu",
            time_limit="10",
            cpus_per_task=1,
            mem="500M",
            comment="tok-arr",
            output="/home/u/pipelines/run-7f3a/array-0.out",
            array="0-4,7,9-12%3",
        ),
        False,
    ),
    "hetjob": (
        SbatchSpec(
            job_name="dg-het",
            script_path="/work/run/job.sh",
            partition="cpu",
            time_limit="10",
            num_nodes=1,
            mem="500M",
            comment="tok-het",
            het_components=(
                HetComponentSpec(partition="gpu", num_nodes=1, cpus_per_task=2, mem="1G",
                                 gpus_per_node=1),
                HetComponentSpec(num_nodes=2),
            ),
        ),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_SPECS))
def test_sbatch_argv_matches_golden_file(name: str) -> None:
    spec, test_only = GOLDEN_SPECS[name]
    rendered = "\n".join(sbatch_argv(spec, test_only=test_only)) + "\n"
    path = GOLDEN_DIR / f"sbatch_{name}.argv"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert path.exists(), f"{path} missing; run with UPDATE_GOLDEN=1 to create it"
    assert rendered == path.read_text()


def test_sbatch_argv_shape() -> None:
    spec, _ = GOLDEN_SPECS["cpu_full"]
    argv = sbatch_argv(spec)
    assert argv[0] == "sbatch"
    assert argv[-1] == spec.script_path
    options = argv[1:-1]
    assert "--parsable" in options
    assert "--test-only" not in options
    names = [option.split("=", 1)[0] for option in options]
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    assert "--time=01:30:00" in options  # canonical form of "90" minutes


def test_spec_normalises_time_and_signal() -> None:
    spec = SbatchSpec(
        job_name="j", script_path="s", time_limit="2-0", time_min="30", signal="b:sigusr1"
    )
    assert spec.time_limit == "2-00:00:00"
    assert spec.time_min == "00:30:00"
    assert spec.signal == "B:USR1"


def test_none_fields_are_not_passed() -> None:
    argv = sbatch_argv(SbatchSpec(job_name="j", script_path="s", export=None))
    assert argv == ["sbatch", "--job-name=j", "--no-requeue", "--open-mode=append", "--parsable",
                    "s"]


def test_the_requeue_policy_is_always_explicit() -> None:
    """A site's JobRequeue default never decides: False passes --no-requeue, True --requeue."""
    assert "--no-requeue" in sbatch_argv(SbatchSpec(job_name="j", script_path="s"))
    argv = sbatch_argv(SbatchSpec(job_name="j", script_path="s", requeue=True))
    assert "--requeue" in argv and "--no-requeue" not in argv
    assert "--open-mode=append" in argv  # a second start keeps the first start's logs
    with pytest.raises(ConfigurationError, match="requeue"):
        SbatchSpec(job_name="j", script_path="s", requeue="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"job_name": ""}, "job_name"),
        ({"job_name": "a b"}, "job_name"),
        ({"job_name": "it's"}, "job_name"),
        ({"job_name": 'say"hi"'}, "job_name"),
        ({"job_name": "a/b"}, "job_name"),
        ({"job_name": "a|b"}, "job_name"),
        ({"job_name": "a,b"}, "job_name"),
        ({"job_name": "a\nb"}, "job_name"),
        ({"job_name": "x" * 201}, "job_name"),
        ({"script_path": ""}, "script_path"),
        ({"script_path": "a\nb"}, "script_path"),
        ({"partition": "gpu; touch pwned"}, "partition"),
        ({"partition": ""}, "partition"),
        ({"qos": "normal$(id)"}, "qos"),
        ({"account": "a b"}, "account"),
        ({"reservation": "r`id`"}, "reservation"),
        ({"time_limit": "0"}, "time_limit"),
        ({"time_limit": "later"}, "time_limit"),
        ({"time_min": "-1"}, "time_min"),
        ({"time_limit": "00:10:00", "time_min": "00:20:00"}, "time_min"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"num_nodes": True}, "num_nodes"),
        ({"cpus_per_task": "2"}, "cpus_per_task"),
        ({"ntasks": -1}, "ntasks"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"mem": "4 GB"}, "mem"),
        ({"mem_per_cpu": "lots"}, "mem_per_cpu"),
        ({"mem": "4G", "mem_per_cpu": "1G"}, "mem_per_cpu"),
        ({"gres": "gpu 2"}, "gres"),
        ({"signal": "USR1@70000"}, "signal"),
        ({"signal": "NOPE@60"}, "signal"),
        ({"signal": "X:USR1"}, "signal"),
        ({"signal": "99"}, "signal"),
        ({"comment": "a\nb"}, "comment"),
        ({"comment": "x" * 1001}, "comment"),
        ({"output": "a\x00b"}, "output"),
        ({"nodelist": "c1; id"}, "nodelist"),
        ({"export": "ALL, X=1"}, "export"),
        ({"exclusive": "yes"}, "exclusive"),
        ({"extra_directives": ("--time=5",)}, "extra_directives[0]"),
        ({"extra_directives": ("--wrap=id",)}, "extra_directives[0]"),
    ],
)
def test_spec_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"job_name": "job", "script_path": "/s.sh", **kwargs}
    with pytest.raises(ConfigurationError) as caught:
        SbatchSpec(**values)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}=")


@pytest.mark.parametrize("name", ["dg-run_1.2", "a" * 200, "job:+@%=", "DG-RUN"])
def test_valid_job_names(name: str) -> None:
    assert SbatchSpec(job_name=name, script_path="s").job_name == name


def test_partition_lists_are_allowed() -> None:
    assert "--partition=cpu,gpu" in sbatch_argv(
        SbatchSpec(job_name="j", script_path="s", partition="cpu,gpu")
    )


def test_squeue_argv() -> None:
    argv = squeue_argv(["busy", "waiter", "busy"], job_ids=[10, "14"])
    assert argv == [
        "squeue",
        "--noheader",
        "--format=%i|%j|%T|%r|%L|%l|%S|%e|%N|%D|%b|%P|%C|%m|%M|%k",
        "--states=all",
        "--name=busy,waiter",
        "--jobs=10,14",
    ]
    assert SQUEUE_FORMAT.split("|")[-1] == "%k"  # the comment comes last
    assert [code for _, code in SQUEUE_FIELDS] == SQUEUE_FORMAT.split("|")


def test_squeue_argv_by_id_only() -> None:
    assert squeue_argv(None, job_ids=["7_3"])[-1] == "--jobs=7_3"


@pytest.mark.parametrize(
    ("names", "ids", "field"),
    [
        ([], None, "job_names"),
        (None, [], "job_names"),
        (["a,b"], None, "job_names[0]"),
        (["ok", "bad name"], None, "job_names[1]"),
        ("busy", None, "job_names"),
        (["ok"], ["12;id"], "job_ids[0]"),
        (["ok"], [True], "job_ids[0]"),
    ],
)
def test_squeue_argv_rejects(names: object, ids: object, field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        squeue_argv(names, ids)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_sacct_argv() -> None:
    assert sacct_argv(["4", 5]) == [
        "sacct",
        "--parsable2",
        "--noheader",
        "--format=JobID,JobName,State,ExitCode,Elapsed,ElapsedRaw,MaxRSS,TotalCPU,NNodes,"
        "NodeList,AllocCPUS,Start,End,ReqTRES,AllocTRES,TRESUsageInAve,TRESUsageInMax,"
        "TRESUsageInMaxNode",
        "--jobs=4,5",
    ]
    assert len(SACCT_FIELDS) == 18
    with pytest.raises(ConfigurationError):
        sacct_argv([])
    with pytest.raises(ConfigurationError):
        sacct_argv(["4 5"])


def test_scancel_argv() -> None:
    assert scancel_argv(["12"]) == ["scancel", "12"]
    assert scancel_argv(job_name="dg-run") == ["scancel", "--name=dg-run"]
    assert scancel_argv(["12"], signal="SIGUSR1", batch_only=True) == [
        "scancel",
        "--batch",
        "--signal=USR1",
        "12",
    ]
    assert scancel_argv([12, 13], job_name="dg", signal="15", full=True) == [
        "scancel",
        "--full",
        "--name=dg",
        "--signal=15",
        "12",
        "13",
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "job_ids"),
        ({"job_ids": []}, "job_ids"),
        ({"job_ids": ["1"], "batch_only": True, "full": True}, "full"),
        ({"job_ids": ["1"], "signal": "USR1@60"}, "signal"),
        ({"job_ids": ["1"], "signal": "BOGUS"}, "signal"),
        ({"job_name": "x y"}, "job_name"),
        ({"job_ids": ["1 2"]}, "job_ids[0]"),
    ],
)
def test_scancel_argv_rejects(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        scancel_argv(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_scontrol_argvs() -> None:
    assert scontrol_show_config_argv() == ["scontrol", "show", "config"]
    assert scontrol_update_timelimit_argv("5", "00:05:00") == [
        "scontrol",
        "update",
        "JobId=5",
        "TimeLimit=00:05:00",
    ]
    assert scontrol_update_timelimit_argv(5, "+00:03:00")[-1] == "TimeLimit=+00:03:00"
    assert scontrol_update_timelimit_argv(5, "-1")[-1] == "TimeLimit=-00:01:00"
    assert scontrol_update_timelimit_argv(5, "UNLIMITED")[-1] == "TimeLimit=UNLIMITED"
    assert scontrol_update_timelimit_argv(5, 90)[-1] == "TimeLimit=00:01:30"


@pytest.mark.parametrize(
    ("job_id", "value", "field"),
    [
        ("5;id", "10", "job_id"),
        ("5", "0", "value"),
        ("5", 0, "value"),
        ("5", "soon", "value"),
        ("5", "+UNLIMITED", "value"),
        ("5", "+", "value"),
    ],
)
def test_scontrol_update_rejects(job_id: str, value: object, field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        scontrol_update_timelimit_argv(job_id, value)  # type: ignore[arg-type]
    assert caught.value.field == field
