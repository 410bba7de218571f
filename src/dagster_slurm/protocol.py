"""Values the library and its cluster-side scripts must agree on, defined once.

The Python side imports them from here; the bash templates receive them through the
template renderer (:func:`~dagster_slurm.launchers.script.render_template` fills
``{{ protocol.NAME }}`` placeholders from :data:`TEMPLATE_VALUES`), so a template never
spells one of them itself (a unit test renders every template and fails when one does).
"""

from __future__ import annotations

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
