"""Argv builders for the Slurm commands the library runs.

Every builder returns a list of strings, one argv element per option, with values attached
as ``--name=value``. Nothing here runs anything or quotes anything: the transport quotes the
argv once (:func:`dagster_slurm.transport.base.render_command`), so every value reaches Slurm
literally, whatever characters it contains. Values are still validated up front
(:class:`SbatchSpec` checks its fields on construction) so that a mistake is reported with
the offending field and value before anything is sent to the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.slurm.array_spec import validate_array_expression
from dagster_slurm.slurm.directives import option_name, validate_extra_sbatch_directives
from dagster_slurm.slurm.hetjob import HET_SEPARATOR, HetComponentSpec, het_component_argv
from dagster_slurm.slurm.scontrol import (  # noqa: F401 - re-exported
    scontrol_show_config_argv,
    scontrol_update_timelimit_argv,
)
from dagster_slurm.slurm.validation import (
    MAX_COMMENT_LENGTH,
    validate_count,
    validate_export,
    validate_gres,
    validate_hostlist,
    validate_job_id,
    validate_job_name,
    validate_memory,
    validate_sbatch_signal,
    validate_signal_name,
    validate_slurm_name,
    validate_text,
)
from dagster_slurm.slurm.version import SlurmFeature, SlurmVersion, offers
from dagster_slurm.slurm.walltime import parse_duration, validate_walltime

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


@dataclass(frozen=True)
class SbatchSpec:
    """Everything :func:`sbatch_argv` passes to ``sbatch`` for one batch job.

    Each optional field left as None is not passed at all, so the scheduler's (partition's)
    default applies. Values are validated on construction; an invalid one raises
    :class:`~dagster_slurm.errors.ConfigurationError` naming the field. ``time_limit`` and
    ``time_min`` are stored in canonical ``[D-]HH:MM:SS`` form.
    """

    job_name: str
    """``--job-name``; also what :func:`squeue_argv` filters on."""
    script_path: str
    """Path of the batch script on the cluster; passed last."""
    partition: str | None = None
    """``--partition`` (a comma list lets Slurm pick the first that fits)."""
    qos: str | None = None
    """``--qos``: quality of service."""
    account: str | None = None
    """``--account`` charged for the job."""
    reservation: str | None = None
    """``--reservation`` to run in."""
    time_limit: str | None = None
    """``--time``: the walltime, any Slurm duration format or ``UNLIMITED``."""
    time_min: str | None = None
    """``--time-min``: the shortest walltime the backfill scheduler may shrink ``time_limit`` to."""
    num_nodes: int | None = None
    """``--nodes``: number of nodes."""
    ntasks: int | None = None
    """``--ntasks``: total number of tasks."""
    ntasks_per_node: int | None = None
    """``--ntasks-per-node``."""
    cpus_per_task: int | None = None
    """``--cpus-per-task``."""
    mem: str | None = None
    """``--mem``: memory per node, e.g. ``4096M``; exclusive with ``mem_per_cpu``."""
    mem_per_cpu: str | None = None
    """``--mem-per-cpu``; exclusive with ``mem``."""
    gpus_per_node: int | None = None
    """``--gpus-per-node``."""
    gres: str | None = None
    """``--gres``, e.g. ``gpu:a100:2``."""
    signal: str | None = None
    """``--signal``: ``[{R|B}:]<signal>[@<seconds before the time limit>]``, e.g. ``B:USR1@60``."""
    comment: str | None = None
    """``--comment``: free text (no newlines), readable back with ``squeue %k``."""
    output: str | None = None
    """``--output``: stdout file pattern."""
    error: str | None = None
    """``--error``: stderr file pattern."""
    chdir: str | None = None
    """``--chdir``: working directory of the batch script."""
    nodelist: str | None = None
    """``--nodelist``: host list the job must include, e.g. ``c[1-2]``."""
    exclusive: bool = False
    """``--exclusive`` when True: no sharing of the nodes with other jobs."""
    hold: bool = False
    """``--hold`` when True: submit held (priority 0) until released."""
    requeue: bool = False
    """``--requeue`` when True, ``--no-requeue`` when False (always passed, so a site's
    ``JobRequeue`` default never decides): whether Slurm may start the job again from the
    beginning after a node failure, a preemption or ``scontrol requeue``."""
    export: str | None = "ALL"
    """``--export``: which environment variables reach the job (default ``ALL``)."""
    extra_directives: tuple[str, ...] = ()
    """Further long-form options, checked by
    :func:`~dagster_slurm.slurm.directives.validate_extra_sbatch_directives`."""
    array: str | None = None
    """``--array``: the task indices of a job array, with ``%N`` to run at most N at once
    (:func:`~dagster_slurm.slurm.arrays.array_expression`); None: an ordinary job."""
    het_components: tuple[HetComponentSpec, ...] = ()
    """The later components of a heterogeneous job (see :mod:`dagster_slurm.slurm.hetjob`);
    the fields above are then component 0 and the job's. Empty: an ordinary job."""

    def __post_init__(self) -> None:
        validate_job_name("job_name", self.job_name)
        validate_text("script_path", self.script_path)
        for name in ("partition", "qos", "account", "reservation"):
            _optional(name, getattr(self, name), validate_slurm_name)
        for name in ("num_nodes", "ntasks", "ntasks_per_node", "cpus_per_task", "gpus_per_node"):
            _optional(name, getattr(self, name), validate_count)
        for name in ("mem", "mem_per_cpu"):
            _optional(name, getattr(self, name), validate_memory)
        if self.mem is not None and self.mem_per_cpu is not None:
            raise ConfigurationError(
                "mem_per_cpu", self.mem_per_cpu, f"cannot be combined with mem={self.mem!r}"
            )
        _optional("gres", self.gres, validate_gres)
        _optional("nodelist", self.nodelist, validate_hostlist)
        _optional("export", self.export, validate_export)
        _optional("comment", self.comment, _validate_comment)
        _optional("array", self.array, validate_array_expression)
        for name in ("output", "error", "chdir"):
            _optional(name, getattr(self, name), validate_text)
        for name in ("exclusive", "hold", "requeue"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(name, getattr(self, name), "must be True or False")
        for index, component in enumerate(self.het_components):
            if not isinstance(component, HetComponentSpec):
                raise ConfigurationError(
                    f"het_components[{index}]", component, "must be a HetComponentSpec"
                )
        self._normalise()

    def _normalise(self) -> None:
        """Store canonical forms of the time and signal fields (validating them)."""
        limit = _optional("time_limit", self.time_limit, validate_walltime)
        minimum = _optional("time_min", self.time_min, validate_walltime)
        if limit is not None and minimum is not None:
            if (parse_duration(minimum) or 0.0) > (parse_duration(limit) or 0.0):
                raise ConfigurationError(
                    "time_min", self.time_min, f"must not exceed time_limit={self.time_limit!r}"
                )
        signal = _optional("signal", self.signal, validate_sbatch_signal)
        extra = validate_extra_sbatch_directives(self.extra_directives, field="extra_directives")
        object.__setattr__(self, "time_limit", limit)
        object.__setattr__(self, "time_min", minimum)
        object.__setattr__(self, "signal", signal)
        object.__setattr__(self, "extra_directives", extra)
        object.__setattr__(self, "het_components", tuple(self.het_components))


def _validate_comment(field: str, value: object) -> str:
    return validate_text(field, value, max_length=MAX_COMMENT_LENGTH)


_T = TypeVar("_T")


def _optional(field: str, value: object, check: Callable[[str, object], _T]) -> _T | None:
    """``check(field, value)`` unless ``value`` is None (the option is then not passed)."""
    return None if value is None else check(field, value)


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
