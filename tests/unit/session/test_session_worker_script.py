"""A worker allocation's batch script, run with bash and the stub Slurm, Ray and python3
commands of ``worker_script_stubs`` (which stand in for the cluster). Real Ray on real Slurm
is tested in ``tests/integration/test_worker_allocations.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from worker_script_stubs import JOB_ID, PACE, wait_for, worker, worker_config


def test_it_waits_for_the_head_then_joins_with_its_settings(tmp_path):
    with worker(tmp_path) as w:
        wait_for(lambda: w.state() == "waiting", "the waiting state")
        assert w.file("nodes") == "n1\n"
        wait_for(lambda: "waiting for the run's Ray head" in w.log(), "the waiting line")
        port = w.name_head("7")
        node = wait_for(lambda: w.joined("7"), "the node to join head 7")
        assert node == f"id{w.ray_pid()}"
        wait_for(lambda: w.state() == "joined", "the joined state")
        args = w.ray_args()
        assert f"--address=127.0.0.1:{port}" in args and "--block" in args
        resources = [a for a in args if a.startswith("--resources=")]
        assert json.loads(resources[-1].split("=", 1)[1]) == {
            "accelerator:a40": 1, "dagster_slurm_worker": 1}
        assert "--num-gpus=2" in args
        cpus = [a for a in args if a.startswith("--num-cpus=")]
        assert cpus[-1] == "--num-cpus=8" and cpus[0] == "--num-cpus=2"  # SLURM_CPUS_ON_NODE
        assert args.index("--log-style=record") < args.index(resources[-1]) < args.index(cpus[-1])
        assert "--redis-password=s3cret pw'" in args
        srun = (w.stubs / "srun.args").read_text()
        assert "s3cret" not in srun and "--nodelist=n1" in srun and "--cpus-per-task=2" in srun
        assert (w.stubs / "srun.password_in_env").exists()
        w.proc.send_signal(signal.SIGTERM)
        assert w.exit_code() == 143
        assert w.state() == "released cancelled" and w.ray_nodes() == []


def test_a_node_that_ends_starts_again_then_stays_out_until_another_head(tmp_path):
    with worker(tmp_path, restart_delays=(1, 1)) as w:
        w.name_head("7")
        first = wait_for(lambda: w.joined("7"), "the first join")
        for restart in (1, 2):
            os.kill(w.ray_pid(), signal.SIGKILL)
            wait_for(lambda prev=first: (w.joined("7") or prev) != prev, f"rejoin {restart}")
            first = w.joined("7")
            assert f"starting it again in 1 s (restart {restart} of 2)" in w.log()
        os.kill(w.ray_pid(), signal.SIGKILL)
        wait_for(lambda: "it stays out until the allocation joins another head" in w.log(),
                 "the node to stay out")
        wait_for(lambda: w.ray_nodes() == [] and w.state() == "partial", "no joined node")
        w.name_head("8")
        wait_for(lambda: w.joined("8"), "the join of head 8")
        assert "the run's Ray head is now job 8" in w.log()


def test_a_new_head_moves_every_node_to_it(tmp_path):
    with worker(tmp_path) as w:
        w.name_head("7")
        old = wait_for(lambda: w.joined("7"), "the join of head 7")
        port = w.name_head("8")
        new = wait_for(lambda: w.joined("8"), "the join of head 8")
        assert new != old and f"--address=127.0.0.1:{port}" in w.ray_args()
        assert "restart" not in w.log()  # leaving a head is no strike


def test_a_drain_asks_ray_then_stops_each_idle_node_and_exits_0(tmp_path):
    with worker(tmp_path) as w:
        w.name_head("7")
        node = wait_for(lambda: w.joined("7"), "the join")
        deadline = int(time.time()) + 60
        Path(w.paths.worker_drain(JOB_ID)).write_text(f"deadline={deadline}\n")
        w.proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: w.state() == "draining", "the draining state")
        drain = wait_for(lambda: (w.stubs / "ray.drain-node").exists()
                         and (w.stubs / "ray.drain-node").read_text().splitlines(), "drain-node")
        assert drain[drain.index("--node-id") + 1] == node
        assert drain[drain.index("--reason") + 1] == "DRAIN_NODE_REASON_PREEMPTION"
        assert 50 <= int(drain[drain.index("--deadline-remaining-seconds") + 1]) <= 60
        assert w.proc.poll() is None  # busy: it stays until Ray reports the node idle
        (w.stubs / "idle").write_text("")
        assert w.exit_code() == 0
        assert w.state() == "released drained" and w.ray_nodes() == []
        assert "is idle and left the Ray cluster" in w.log()


def test_what_still_runs_at_the_drain_deadline_is_stopped(tmp_path):
    config = worker_config(signal_before_timeout="USR2@17")
    with worker(tmp_path, config) as w:
        w.name_head("7")
        wait_for(lambda: w.joined("7"), "the join")
        w.proc.send_signal(signal.SIGUSR2)  # the pre-walltime signal: deadline now + 17 - 15
        assert w.exit_code() == 0
        assert w.state() == "released drained"
        assert "drain deadline reached; stopping the node(s) still busy" in w.log()


def test_without_a_live_head_it_releases_itself_after_rejoin_timeout(tmp_path):
    with worker(tmp_path, worker_config(rejoin_timeout=3)) as w:
        w.name_head("7")
        wait_for(lambda: w.joined("7"), "the join")
        (w.stubs / "head_state").write_text("")  # the head's job has ended, its GCS with it
        assert w.head_socket is not None
        w.head_socket.close()
        assert w.exit_code() == 0
        assert w.state() == "released no_head" and w.ray_nodes() == []
        log = w.log()
        assert "is not live; stopping the nodes" in log and "rejoin_timeout 3 s" in log


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGHUP"])
def test_a_cancellation_while_waiting_releases_it(tmp_path, signal_name):
    with worker(tmp_path) as w:
        wait_for(lambda: w.state() == "waiting", "the waiting state")
        # the main loop's own line: bash runs a SIGINT trap even while it parses a command
        # substitution, which fails that trap, and the script's start has many of them
        wait_for(lambda: "waiting for the run's Ray head" in w.log(), "the waiting line")
        w.proc.send_signal(getattr(signal, signal_name))
        assert w.exit_code() == 128 + getattr(signal, signal_name)
        assert w.state() == "released cancelled"


def test_a_real_allocation_keeps_the_production_pace(tmp_path):
    # the tests' environment shortens these; a real allocation's sets none of the variables
    with worker(tmp_path):
        text = (tmp_path / "worker.sh").read_text()
    for line in ("__dw_round=1", "__dw_live_every=5", "__dw_ids_every=2", "__dw_drain_round=2"):
        assert f"\n{line}\n" in text
    for name in PACE:
        assert f'"${{{name}-}}"' in text
