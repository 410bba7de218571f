"""Values the library and its cluster-side scripts must agree on, defined once.

The Python side imports them from here. The bash templates receive them through the
template renderer: :func:`~dagster_slurm.launchers.script.render_template` fills every
placeholder ``@@{protocol_<name>}`` a template uses from :data:`TEMPLATE_VALUES` (``<name>``
is the constant's name in lowercase, e.g. ``@@{protocol_removal_signal}``), quoted like any
other word, without the caller passing it. A template assigns each one to a shell variable
once and uses the variable, so it never spells one of these values itself; a unit test
(``tests/unit/launchers/test_protocol_values.py``) renders every template, checks that the
rendered scripts carry the values of this module, and fails when a template's own text
hard-codes one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

#: Seconds a submission record may stay without a job id before its token is looked up in
#: squeue (the submitter may still be waiting for sbatch's answer until then).
SUBMIT_GRACE_SECONDS = 150.0
#: Seconds after which a failed head submission record no longer fails new steps (a retry
#: submits again).
FAILED_RECORD_SECONDS = 60.0
#: Seconds a drained worker allocation may run past its drain deadline before it is
#: cancelled.
DRAIN_GRACE_SECONDS = 30.0
#: Seconds before a worker allocation's walltime by which its nodes must have left Ray.
WALLTIME_MARGIN_SECONDS = 15.0
#: The signal that asks a worker allocation to drain its nodes and leave.
REMOVAL_SIGNAL = "USR1"
#: The worker allocation's state word while its nodes drain.
WORKER_DRAINING = "draining"
#: The first word of a worker allocation's state once it left the Ray cluster
#: (``released <reason>``).
WORKER_RELEASED = "released"

#: The exit status a job script records (status file and exit) when Slurm restarted its
#: job (``SLURM_RESTART_COUNT`` set) and the payload may not start again: the payload did
#: not run in this start. Also the exit status of a restarted step server.
REQUEUED_STATUS = 118
#: The words a restarted job script writes on stderr when it refuses to start the payload
#: again: with :data:`REQUEUED_STATUS` they tell the library that the refusal, not the
#: payload, ended the job.
REQUEUE_REFUSAL = "the payload is not started again"

#: The prefix of the template placeholders the renderer fills from this module.
TEMPLATE_PREFIX = "protocol_"


def _template_word(name: str, value: float | str) -> str:
    """``value`` as the templates get it: strings as they are, seconds as whole numbers
    (bash arithmetic has no fractions, so a fractional value is refused at import)."""
    if isinstance(value, str):
        return value
    if value != int(value):
        raise ValueError(f"{name}={value!r}: the templates compute in whole seconds")
    return str(int(value))


#: Every value above by placeholder name (``protocol_`` + the name in lowercase), as the
#: shell word the renderer puts in; read-only.
TEMPLATE_VALUES: Mapping[str, str] = MappingProxyType({
    TEMPLATE_PREFIX + name.lower(): _template_word(name, value)
    for name, value in (
        ("SUBMIT_GRACE_SECONDS", SUBMIT_GRACE_SECONDS),
        ("FAILED_RECORD_SECONDS", FAILED_RECORD_SECONDS),
        ("DRAIN_GRACE_SECONDS", DRAIN_GRACE_SECONDS),
        ("WALLTIME_MARGIN_SECONDS", WALLTIME_MARGIN_SECONDS),
        ("REMOVAL_SIGNAL", REMOVAL_SIGNAL),
        ("WORKER_DRAINING", WORKER_DRAINING),
        ("WORKER_RELEASED", WORKER_RELEASED),
        ("REQUEUED_STATUS", REQUEUED_STATUS),
        ("REQUEUE_REFUSAL", REQUEUE_REFUSAL),
    )
})
