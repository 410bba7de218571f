"""The Ray launcher's job script: what it does, and the names it shares with Python.

In ``slurm`` mode the job script (running on the allocation's first node) starts one Ray
node per host of the allocation, each inside an ``srun --overlap`` step: the head on its
own host, then, once the head's GCS answers, a worker on every other host. Each node works
out its own address and ports on its host; the workers get the head's *address*, so host
names never have to resolve between nodes. When every node has joined, the payload runs on
the head's host with ``RAY_ADDRESS`` set (``ray.init(address="auto")`` connects), under
the same signal and exit-status contract as with :class:`~dagster_slurm.launchers.BashLauncher`.
Afterwards, and on a failed start, every node is stopped, the workers before the head:
its shell (told through ``scancel --signal=URG`` on its step, a signal Ray's processes
ignore) sends SIGTERM to its ``ray start`` alone, which shuts the node down in order; the
script waits up to :data:`RAY_STOP_GRACE_SECONDS`, then ends the step. Never ``ray stop``:
it would stop every Ray cluster of the host. After a cancellation or drain the nodes are
asked to stop without waiting, so that the status file is written before Slurm kills what
is left; ``ray start --block`` keeps all Ray processes inside the steps, where Slurm's
process tracking finds them (their temp dirs may then stay behind).

In ``local`` mode the same script starts one Ray node on this machine (address 127.0.0.1
unless configured) and stops it the same way.

Script contract, beyond the common one (``templates/job_common.sh``):

* exit status :data:`RAY_START_FAILED_STATUS` when the cluster does not come up: a node's
  step ended early, or not all nodes joined within ``startup_timeout``; the last lines of
  the job's stderr name the nodes and show their last output lines (Ray's own log tails
  included);
* stdout gets ``Ray head node web UI: http://<address>:<port>`` and an ``ssh -L`` hint;
* exit status 125 when ``working_dir`` cannot be entered;
* each node's output goes to ``ray-node-<index>.log`` in the job directory and, prefixed
  with ``[ray <host>]``, to the job's stderr;
* the ``ray`` command must be on ``PATH`` after activation, on every node.

:meth:`RayLauncher.render <dagster_slurm.launchers.ray.RayLauncher.render>` renders the
script from the templates named here. Ports: see :mod:`dagster_slurm.launchers.ray_ports`.
"""

from __future__ import annotations

RAY_TEMPLATE = "ray_launcher.sh"
"""The Ray launcher's part of the job script (after the common prologue)."""
RAY_NODE_TEMPLATE = "ray_node.sh"
"""Functions that run on every Ray node."""

RAY_START_FAILED_STATUS = 123
"""Exit status of a job whose Ray cluster did not come up."""

RAY_STOP_GRACE_SECONDS = 15
"""How long the script waits for Ray nodes to stop after SIGTERM before killing them."""

RAY_DASHBOARD_PREFIX = "Ray head node web UI:"
"""Start of the job script's stdout line with the Ray dashboard's URL."""

RAY_TUNNEL_PREFIX = "To reach it from your machine:"
"""Start of the job script's stdout line with the ``ssh -L`` command that reaches the
dashboard from outside the cluster (slurm mode only)."""

RAY_NOTABLE_PREFIXES = (RAY_DASHBOARD_PREFIX, RAY_TUNNEL_PREFIX)
"""Starts of the launcher's stdout lines that also belong in the Dagster log. The only
definition of these lines: the script prints them from :data:`RAY_DASHBOARD_FORMAT` and
:data:`RAY_TUNNEL_FORMAT`, and :mod:`dagster_slurm.jobs.logs` picks them out of the output."""

RAY_DASHBOARD_FORMAT = RAY_DASHBOARD_PREFIX + " http://%s:%s\\n"
"""``printf`` format of the dashboard line (arguments: head address, dashboard port)."""

RAY_TUNNEL_FORMAT = RAY_TUNNEL_PREFIX + " ssh -L 8265:%s:%s <login-host>, then open %s\\n"
"""``printf`` format of the tunnel line (arguments: head address, dashboard port, local URL)."""
