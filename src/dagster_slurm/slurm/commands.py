"""Argv builders for the Slurm commands the library runs.

Every builder returns a list of strings, one argv element per option, with values attached
as ``--name=value``. Nothing here runs anything or quotes anything: the transport quotes the
argv once (:func:`dagster_slurm.transport.base.render_command`), so every value reaches Slurm
literally, whatever characters it contains. Values are still validated up front
(:class:`~dagster_slurm.slurm.sbatch_spec.SbatchSpec`, re-exported here, checks its fields
on construction) so that a mistake is reported with the offending field and value before
anything is sent to the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.directives import option_name
from dagster_slurm.slurm.hetjob import HET_SEPARATOR, het_component_argv
from dagster_slurm.slurm.sbatch_spec import SbatchSpec  # re-exported: callers import it here
from dagster_slurm.slurm.scontrol import (  # noqa: F401 - re-exported
    scontrol_show_config_argv,
    scontrol_update_timelimit_argv,
)
from dagster_slurm.slurm.validation import validate_job_id, validate_job_name, validate_signal_name
from dagster_slurm.slurm.version import SlurmFeature, SlurmVersion, offers

SQUEUE_FIELDS: tuple[tuple[str, str], ...] = (
    ("job_id", "%i"),
    ("name", "%j"),
    ("state", "%T"),
    ("reason", "%r"),
    ("time_left", "%L"),
    ("time_limit", "%l"),
    ("start_time", "%S"),
    ("end_time", "%e"),
    ("node_list", "%N"),
    ("num_nodes", "%D"),
    ("tres_per_node", "%b"),
    ("partition", "%P"),
    ("cpus", "%C"),
    ("min_memory", "%m"),
    ("elapsed", "%M"),
    # Last on purpose: a '|' inside a comment then only lengthens the last column.
    ("comment", "%k"),
)
"""``(record field, squeue format code)`` in the order :func:`squeue_argv` requests them."""

SQUEUE_FORMAT = "|".join(code for _, code in SQUEUE_FIELDS)
"""The ``squeue -o`` format string: :data:`SQUEUE_FIELDS` joined by ``|``."""

SACCT_BASE_FIELDS: tuple[str, ...] = (
    "JobID",
    "JobName",
    "State",
    "ExitCode",
    "Elapsed",
    "ElapsedRaw",
    "MaxRSS",
    "TotalCPU",
    "NNodes",
    "NodeList",
    "AllocCPUS",
    "Start",
    "End",
)
"""The leading ``sacct`` columns: state, exit code, times, memory, CPU time and nodes."""

SACCT_TRES_FIELDS: tuple[str, ...] = (
    "ReqTRES",
    "AllocTRES",
    "TRESUsageInAve",
    "TRESUsageInMax",
    "TRESUsageInMaxNode",
)
"""The trackable-resource columns after them: GPU counts and GPU usage where the site's
accounting records them (see :mod:`dagster_slurm.slurm.tres`)."""

SACCT_FIELDS: tuple[str, ...] = SACCT_BASE_FIELDS + SACCT_TRES_FIELDS
"""The ``sacct --format`` columns :func:`sacct_argv` requests, in order (every release)."""

SACCT_PLANNED_FIELDS: tuple[str, ...] = ("Planned",)
"""Appended to :data:`SACCT_FIELDS` on releases with
:attr:`~dagster_slurm.slurm.version.SlurmFeature.SACCT_PLANNED`: how long the job waited
while eligible to start."""

SQUEUE_STATE_FORMAT = "%i|%T"
"""The ``squeue -o`` format of :func:`squeue_state_argv`: job id and state, the only
columns ``--only-job-state`` fills in."""


def sacct_fields(version: SlurmVersion | None = None) -> tuple[str, ...]:
    """The ``sacct --format`` columns for ``version``: :data:`SACCT_FIELDS`, plus
    :data:`SACCT_PLANNED_FIELDS` where the release has them (appended, so a reader of the
    shorter layout reads the longer one's first columns unchanged)."""
    if offers(version, SlurmFeature.SACCT_PLANNED):
        return SACCT_FIELDS + SACCT_PLANNED_FIELDS
    return SACCT_FIELDS


_OPTION_OF_FIELD: dict[str, str] = {
    "job_name": "job-name",
    "partition": "partition",
    "qos": "qos",
    "account": "account",
    "reservation": "reservation",
    "time_limit": "time",
    "time_min": "time-min",
    "num_nodes": "nodes",
    "ntasks": "ntasks",
    "ntasks_per_node": "ntasks-per-node",
    "cpus_per_task": "cpus-per-task",
    "mem": "mem",
    "mem_per_cpu": "mem-per-cpu",
    "gpus_per_node": "gpus-per-node",
    "gres": "gres",
    "signal": "signal",
    "comment": "comment",
    "output": "output",
    "error": "error",
    "chdir": "chdir",
    "nodelist": "nodelist",
    "export": "export",
    "array": "array",
}
_FLAG_OF_FIELD: dict[str, str] = {"exclusive": "exclusive", "hold": "hold"}


def sbatch_argv(
    spec: SbatchSpec,
    *,
    test_only: bool = False,
    script_on_stdin: bool = False,
    version: SlurmVersion | None = None,
) -> list[str]:
    """``sbatch`` argv for ``spec``: options sorted by name, then the script path.

    A heterogeneous job (``spec.het_components``) gets, after component 0's options, a
    ``:`` and the options of each later component (:func:`~dagster_slurm.slurm.hetjob.het_component_argv`).

    Always adds ``--requeue`` or ``--no-requeue`` (``spec.requeue``), ``--open-mode=append``
    (a second start of the job keeps what the first wrote) and ``--parsable`` (stdout is
    ``<job id>[;<cluster>]``, see :func:`~dagster_slurm.slurm.parsers.parse_sbatch_parsable`). With ``test_only`` adds
    ``--test-only``: Slurm then only estimates the start (on stderr, see
    :func:`~dagster_slurm.slurm.parsers.parse_test_only`) and submits nothing, although the
    estimate consumes a job id. With ``script_on_stdin`` the script path is left out and
    sbatch reads the script from its standard input. Every option used is accepted alike
    by all supported releases, so ``version`` changes nothing (it is taken for symmetry
    with the other builders).
    """
    del version
    options: dict[str, str] = {"parsable": "--parsable"}
    if test_only:
        options["test-only"] = "--test-only"
    for spec_field in fields(spec):
        value = getattr(spec, spec_field.name)
        if spec_field.name in _OPTION_OF_FIELD and value is not None:
            option = _OPTION_OF_FIELD[spec_field.name]
            options[option] = f"--{option}={value}"
        elif spec_field.name in _FLAG_OF_FIELD and value:
            options[_FLAG_OF_FIELD[spec_field.name]] = f"--{_FLAG_OF_FIELD[spec_field.name]}"
    requeue = "requeue" if spec.requeue else "no-requeue"
    options[requeue] = f"--{requeue}"
    # A second start of the job (a requeue, a controller that lost its state) appends to the
    # output files instead of truncating what the first start wrote.
    options["open-mode"] = "--open-mode=append"
    for entry in spec.extra_directives:
        options[option_name(entry) or entry] = entry
    argv = ["sbatch", *(options[name] for name in sorted(options))]
    for component in spec.het_components:
        argv += [HET_SEPARATOR, *het_component_argv(component)]
    return argv if script_on_stdin else [*argv, spec.script_path]


def _names_and_ids(
    job_names: Iterable[str] | None, job_ids: Iterable[str | int] | None
) -> tuple[list[str], list[str]]:
    names = _as_list("job_names", job_names)
    ids = _as_list("job_ids", job_ids)
    checked_names = [validate_job_name(f"job_names[{i}]", n) for i, n in enumerate(names)]
    checked_ids = [validate_job_id(f"job_ids[{i}]", j) for i, j in enumerate(ids)]
    return checked_names, checked_ids


def _as_list(field: str, values: Iterable[object] | None) -> list[object]:
    if values is None:
        return []
    if isinstance(values, (str, bytes, int)):
        raise ConfigurationError(field, values, "must be a list, not a single value")
    return list(values)


def squeue_argv(
    job_names: Iterable[str] | None,
    job_ids: Iterable[str | int] | None = None,
    *,
    version: SlurmVersion | None = None,
) -> list[str]:
    """``squeue`` argv listing the given jobs in every state, in :data:`SQUEUE_FORMAT`.

    ``--states=all`` keeps finished jobs listed until Slurm purges them (``MinJobAge``),
    so a final state can be seen. Names and ids both filter (a job must match both when both
    are given); at least one must be non-empty, otherwise the whole queue would be listed.
    Parse the output with :func:`~dagster_slurm.slurm.parsers.parse_squeue`. The same on
    every release (``version`` changes nothing).
    """
    del version
    names, ids = _names_and_ids(job_names, job_ids)
    if not names and not ids:
        raise ConfigurationError("job_names", job_names, "give at least one job name or job id")
    argv = ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}", "--states=all"]
    if names:
        argv.append(f"--name={','.join(dict.fromkeys(names))}")
    if ids:
        argv.append(f"--jobs={','.join(dict.fromkeys(ids))}")
    return argv


def squeue_user_argv(*, version: SlurmVersion | None = None) -> list[str]:
    """``squeue`` argv listing every job of the calling user (``--me``) in every state, in
    :data:`SQUEUE_FORMAT`: the one query a user's shared status answer comes from. The same
    on every release (``--only-job-state`` cannot filter by user)."""
    del version
    return ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}", "--states=all", "--me"]


#: ``squeue --Format`` fields of :func:`squeue_observe_argv`: those of :data:`SQUEUE_FIELDS`
#: plus the trackable resources the scheduler reports (``tres-alloc``: the grant once a job
#: runs), which ``--format`` cannot print. The comment stays last.
SQUEUE_OBSERVE_FIELDS: tuple[str, ...] = (
    "JobID", "Name", "State", "Reason", "TimeLeft", "TimeLimit", "StartTime", "EndTime",
    "NodeList", "NumNodes", "tres-per-node", "Partition", "NumCPUs", "MinMemory", "TimeUsed",
    "tres-alloc", "Comment",
)


def squeue_observe_argv(
    job_names: Iterable[str], *, version: SlurmVersion | None = None
) -> list[str]:
    """``squeue`` argv listing every job of ``job_names`` in every state with
    :data:`SQUEUE_OBSERVE_FIELDS`, ``|``-separated with a header line (``--Format`` with a
    ``|`` suffix per field; parse with :func:`~dagster_slurm.slurm.parsers.parse_squeue`,
    which reads such output by column name). The same on every release."""
    del version
    names, _ = _names_and_ids(job_names, None)
    if not names:
        raise ConfigurationError("job_names", job_names, "give at least one job name")
    fields = ",".join(f"{name}:|" for name in SQUEUE_OBSERVE_FIELDS)
    return ["squeue", f"--Format={fields}", "--states=all",
            f"--name={','.join(dict.fromkeys(names))}"]


def squeue_state_argv(
    job_names: Iterable[str], job_ids: Iterable[str | int], *, version: SlurmVersion | None
) -> list[str]:
    """The running-phase state poll of ``job_ids``: ``squeue --only-job-state`` by id where
    ``version`` offers it (:attr:`~dagster_slurm.slurm.version.SlurmFeature.ONLY_JOB_STATE`),
    with a header line and :data:`SQUEUE_STATE_FORMAT` (job id and state are the only
    columns that query fills in; the header lets
    :func:`~dagster_slurm.slurm.parsers.parse_squeue` read them by name). An id Slurm no
    longer knows is left out, not an error. Elsewhere (or for an unknown version) the full
    listing of ``job_names``, :func:`squeue_argv`.
    """
    if not offers(version, SlurmFeature.ONLY_JOB_STATE):
        return squeue_argv(job_names, version=version)
    _, ids = _names_and_ids(None, job_ids)
    if not ids:
        raise ConfigurationError("job_ids", job_ids, "give at least one job id")
    return ["squeue", "--only-job-state", f"--format={SQUEUE_STATE_FORMAT}", "--states=all",
            f"--jobs={','.join(dict.fromkeys(ids))}"]


def sacct_argv(
    job_ids: Sequence[str | int], *, version: SlurmVersion | None = None
) -> list[str]:
    """``sacct`` argv for the given jobs, allocation and step lines, in
    :func:`sacct_fields` of ``version`` (:data:`SACCT_FIELDS` on 22.05).

    ``--parsable2`` separates columns with ``|`` (no trailing one), ``--noheader`` drops the
    header. Step lines are kept because only they carry ``MaxRSS``. Parse the output with
    :func:`~dagster_slurm.slurm.accounting.parse_sacct`.
    """
    _, ids = _names_and_ids(None, job_ids)
    if not ids:
        raise ConfigurationError("job_ids", job_ids, "give at least one job id")
    return [*sacct_base_argv(version=version), f"--jobs={','.join(dict.fromkeys(ids))}"]


def sacct_base_argv(*, version: SlurmVersion | None = None) -> list[str]:
    """:func:`sacct_argv` without ``--jobs``, for callers that append the ids themselves."""
    return ["sacct", "--parsable2", "--noheader", f"--format={','.join(sacct_fields(version))}"]


def scancel_argv(
    job_ids: Sequence[str | int] | None = None,
    job_name: str | None = None,
    signal: str | None = None,
    batch_only: bool = False,
    full: bool = False,
    *,
    version: SlurmVersion | None = None,
) -> list[str]:
    """``scancel`` argv: cancel (or, with ``signal``, signal) jobs by id and/or name; the
    same on every release (``version`` changes nothing).

    ``batch_only`` (``--batch``) signals only the batch shell, ``full`` (``--full``) the
    batch shell and every step; they exclude each other. At least one of ``job_ids`` and
    ``job_name`` is required (a bare ``scancel`` with a signal would be an error, and with
    a name filter alone only matching jobs are touched).
    """
    del version
    _, ids = _names_and_ids(None, job_ids)
    name = None if job_name is None else validate_job_name("job_name", job_name)
    if not ids and name is None:
        raise ConfigurationError("job_ids", job_ids, "give job ids or a job_name")
    if batch_only and full:
        raise ConfigurationError("full", full, "cannot be combined with batch_only")
    argv = ["scancel"]
    if batch_only:
        argv.append("--batch")
    if full:
        argv.append("--full")
    if name is not None:
        argv.append(f"--name={name}")
    if signal is not None:
        argv.append(f"--signal={validate_signal_name('signal', signal)}")
    argv.extend(dict.fromkeys(ids))
    return argv
