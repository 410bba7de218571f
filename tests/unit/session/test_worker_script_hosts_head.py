"""A worker allocation's batch script hosting the run's Ray head on request (bash with the
stub Slurm, Ray and python3 commands of ``worker_script_stubs``; the step server is a
stub that records RAY_ADDRESS and names this job in ``ray_head``). Real Ray on real Slurm:
``tests/integration/test_worker_head_election.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from worker_script_stubs import JOB_ID, STUBS, Worker, wait_for, worker

# The step server stub: ready with RAY_ADDRESS, then ray_head naming this job at a port the
# test listens on (the stub 'ray start --head' opens none), then it stays.
SERVER = """#!/bin/bash
set -- "$(cat "$STUB_LOG_DIR/session_dir")"
job_dir="$1/jobs/$SLURM_JOB_ID"
printf 'head=n1\\nray_address=%s\\n' "$RAY_ADDRESS" > "$job_dir/ready"
printf 'job_id=%s\\nray_address=127.0.0.1:%s\\nhost=n1\\nwritten_at=2\\n' "$SLURM_JOB_ID" \\
    "$(cat "$STUB_LOG_DIR/server_port")" > "$1/ray_head.tmp" && mv "$1/ray_head.tmp" "$1/ray_head"
exec sleep 1000
"""


def _server(w: Worker) -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    (w.stubs / "server_port").write_text(str(listener.getsockname()[1]))
    script = Path(w.paths.submit_dir("tok")) / "step_server.sh"
    (w.stubs / "session_dir").write_text(w.paths.session_dir)
    script.write_text(SERVER)
    return listener


def _ask(w: Worker, text: str) -> None:
    path = Path(w.paths.job_dir(JOB_ID)) / "host_head"
    path.with_suffix(".tmp").write_text(text)
    os.replace(path.with_suffix(".tmp"), path)


def _head_args(w: Worker) -> list[str]:
    for item in (w.stubs / "rays").iterdir():
        args = item.read_text().splitlines()
        if "--head" in args:
            return args
    return []


def test_it_hosts_a_head_only_control_plane_and_its_node_follows_it(tmp_path):
    with worker(tmp_path) as w:
        listener = _server(w)
        try:
            w.name_head("7")
            wait_for(lambda: w.joined("7"), "the join of head 7")
            _ask(w, "term=3\n")
            state = wait_for(lambda: w.file("host_head_state").startswith("started term=3")
                             and w.file("host_head_state"), "the hosted head to start")
            address = state.split("ray_address=", 1)[1].strip()
            args = _head_args(w)
            assert "--head" in args and f"--port={address.rsplit(':', 1)[1]}" in args
            assert [a for a in args if a.startswith("--num-cpus=")][-1] == "--num-cpus=0"
            assert [a for a in args if a.startswith("--num-gpus=")][-1] == "--num-gpus=0"
            assert '--resources={"dagster_slurm_head": 1}' in args
            assert not any("dagster_slurm_worker" in a for a in args)
            assert "--log-style=record" in args  # the launcher's options
            wait_for(lambda: w.file("ready") == f"head=n1\nray_address={address}\n",
                     "the step server's ready file with the head's address")
            # the node's worker leaves head 7 and joins this allocation's head
            wait_for(lambda: w.joined(JOB_ID), "the node to join the hosted head")
            assert f"the run's Ray head is now job {JOB_ID}" in w.log()
            srun = (w.stubs / "srun.args").read_text()
            assert "--job-name=ray-head" in srun and "--nodelist=n1" in srun
            # withdrawn: the head and the step server stop, the allocation stays
            _ask(w, "stop term=3\n")
            wait_for(lambda: w.file("host_head_state").startswith("stopped term=3"),
                     "the hosted head to stop")
            assert w.file("ready") == ""  # not taken for a later term's
            assert w.proc.poll() is None
        finally:
            listener.close()


def test_a_head_that_does_not_start_is_reported_failed(tmp_path):
    with worker(tmp_path) as w:
        _server(w).close()
        w.name_head("7")
        wait_for(lambda: w.joined("7"), "the join of head 7")
        failing = STUBS["ray"].replace('if [ "$1" = start ]; then',
                                       'case " $* " in *" --head "*) exit 1 ;; esac\n'
                                       'if [ "$1" = start ]; then')
        (w.stubs / "ray").write_text(failing)
        _ask(w, "term=4\n")
        wait_for(lambda: w.file("host_head_state").startswith("failed term=4"),
                 "the failure report")
        assert "ended before the head started" in w.file("host_head_state")
        assert w.file("ready") == ""
        assert w.joined("7")  # the node stays with its head
        assert w.proc.poll() is None


def test_it_stops_hosting_once_the_head_moves_to_another_job_and_stays_a_worker(tmp_path):
    with worker(tmp_path) as w:
        listener = _server(w)
        try:
            w.name_head("7")
            wait_for(lambda: w.joined("7"), "the join of head 7")
            _ask(w, "term=5\n")
            wait_for(lambda: w.joined(JOB_ID), "the node to join the hosted head")
            w.name_head("8")
            wait_for(lambda: w.file("host_head_state").startswith("ended term=5 moved to job 8"),
                     "the hosted head to stop")
            wait_for(lambda: w.joined("8"), "the node to join head 8")
            assert w.file("ready") == "" and w.proc.poll() is None
        finally:
            listener.close()


def test_a_drain_while_it_hosts_the_head_drains_the_step_server_and_keeps_the_head(tmp_path):
    with worker(tmp_path) as w:
        listener = _server(w)
        # the step server stub records the drain signal it gets (the session's: TERM)
        script = Path(w.paths.submit_dir("tok")) / "step_server.sh"
        script.write_text(SERVER.replace(
            "exec sleep 1000",
            "trap 'echo TERM > \"$STUB_LOG_DIR/server_drained\"' TERM\n"
            "while :; do sleep 0.1; done"))
        try:
            w.name_head("7")
            wait_for(lambda: w.joined("7"), "the join of head 7")
            _ask(w, "term=6\n")
            wait_for(lambda: w.joined(JOB_ID), "the node to join the hosted head")
            deadline = int(time.time()) + 60
            Path(w.paths.worker_drain(JOB_ID)).write_text(f"deadline={deadline}\n")
            w.proc.send_signal(signal.SIGUSR1)
            wait_for(lambda: (w.stubs / "server_drained").exists(),
                     "the step server to get its drain signal")
            assert w.file("host_head_state").startswith("draining term=6")
            assert "draining its step server (TERM)" in w.log()
            # the head stays up while the nodes drain (work may still finish there)
            assert w.proc.poll() is None
            (w.stubs / "idle").write_text("")
            assert w.exit_code() == 0
            assert w.state() == "released drained"
        finally:
            listener.close()
