"""The step server's idle pace on the dev cluster: an idle server lists its request
directory only every 2 s, and a request or a cancel written by the library wakes it at once
(the dev cluster's agent runs on the allocation's host, so the wake FIFO reaches it).

The allocation's log says both: the server logs when its wait reached 2 s, and each
started step and cancel says how it was found ("on a wake-up" or "by the listing")."""

import re
import uuid
from pathlib import Path

import pytest
from compute_support import slurm_resource, wait_until

from dagster_slurm import SlurmRunAllocationConfig
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.session.session import RunSession

pytestmark = [pytest.mark.integration]

IDLE = "idle: listing requests every 2 s until woken"


@pytest.fixture(scope="module")
def env(slurm_cluster) -> dict[str, str]:
    return slurm_cluster.env()


def test_an_idle_step_server_is_woken_by_a_request_and_by_a_cancel(env):
    slurm = slurm_resource(env)
    config = SlurmRunAllocationConfig(heartbeat_timeout=120, heartbeat_interval=5)
    session = RunSession(slurm, str(uuid.uuid4()), config, BashLauncher(), activation=lambda: None)
    try:
        allocation = session.allocation
        log = Path(session.paths.output_of(allocation.job_id))

        wait_until(lambda: log.exists() and IDLE in log.read_text(), 30,
                   f"the server's idle line in {log}")
        ok = session.execute_in_session("true", name="after_idle")
        assert ok.exit_code == 0 and not ok.drained
        text = log.read_text()
        started = re.search(r"started step after_idle \(request \w+, found ([a-z -]+)\)", text)
        assert started, text
        assert started.group(1) == "on a wake-up", text
        assert text.index(IDLE) < started.start()

        # A running step does not hold the server at its floor; its cancel wakes it.
        paths = allocation.invocation("long")
        handle = allocation.launch(paths, "#!/bin/bash\nexec sleep 60\n", name="long")

        def idle_while_long_runs() -> bool:
            text = log.read_text()
            return "started step long" in text and text.rfind(IDLE) > text.index("started step long")

        wait_until(idle_while_long_runs, 30,
                   f"the server to go idle with the long step running, in {log}")
        allocation.cancel_step(handle)
        result = allocation.wait(handle)
        assert result.exit_code not in (0, None), result
        cancelled = re.search(r"cancelling step of request (\w+) \(found (.+?)\)", log.read_text())
        assert cancelled and cancelled.group(1) == handle.request_id, log.read_text()
        assert cancelled.group(2) == "on a wake-up", log.read_text()
    finally:
        session.close(cancel=True)
        slurm.close()
