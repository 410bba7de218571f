"""``python head_elector.py <run id> [<claim ttl>]``: one process calling replace_head on the
run session the election tests use (a Bash run allocation on the dev cluster, configured
from the environment), printing ``{"job_id": ...}`` once it returned. ``<claim ttl>``
shortens the election claim's lease in this process (the lease mechanism is the same; the
2-minute bound itself is shown by the unit tests on a fake clock)."""

import json
import os
import sys

from compute_support import slurm_resource

from dagster_slurm import SlurmRunAllocationConfig
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.session.session import RunSession
from dagster_slurm.state import election_transitions


def election_session(env: dict[str, str], run_id: str) -> RunSession:
    """The session every process of one election test builds (same run id, same shape)."""
    config = SlurmRunAllocationConfig(heartbeat_timeout=120, heartbeat_interval=5,
                                      time_limit="00:10:00")
    return RunSession(slurm_resource(env), run_id, config, BashLauncher(),
                      activation=lambda: None)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        election_transitions.CLAIM_TTL = float(sys.argv[2])
    session = election_session(dict(os.environ), sys.argv[1])
    head = session.replace_head(timeout=float(os.environ.get("ELECTOR_TIMEOUT", "240")))
    print(json.dumps({"job_id": head.job_id}), flush=True)
    session.close(cancel=False)
