#!/bin/sh
# Start the development cluster, then live as long as its sshd does.
# `docker stop` (TERM) cancels the jobs and stops the daemons cleanly.
set -eu

dagster-slurm dev-cluster up
dagster-slurm dev-cluster env

trap 'dagster-slurm dev-cluster down; exit 0' TERM INT
pid_file="${DAGSTER_SLURM_DEV_STATE_DIR:-/tmp/dslurm}/run/sshd.pid"
tail --pid="$(cat "$pid_file")" -f /dev/null &
wait $!
echo "sshd exited; stopping the cluster" >&2
dagster-slurm dev-cluster down
exit 1
