#!/usr/bin/env bash
# The whole test suite: installs the project into ./.venv, installs and starts the dev
# cluster (real Slurm, MariaDB + slurmdbd, sshd and its login sites; needs root), then runs
# pytest.
#
# Without arguments the unit tests (tests/unit: no cluster, mostly CPU) run in a second
# pytest process beside the integration tests (tests/integration: mostly waiting on the one
# dev cluster, one test at a time), at a lower CPU priority and on two pytest-xdist workers
# (the tests of one module on one worker, see addopts in pyproject.toml); the unit run's
# output follows the integration run's. Then a second dev cluster with the other Slurm release (24.11 on
# Debian 12, 22.05 on Debian 13; SECOND_SLURM_RELEASE overrides, "none" skips it) comes up
# in /tmp/dslurm-2411 with port offset 1000 and the release_subset integration tests run
# against it (scripts/second_release.sh); test.sh stops that cluster again only if it
# started it. The exit status is the first non-zero one. Extra arguments go to a single
# pytest instead (e.g. a path, -k, --durations=20).
#
# tests/integration/test_login_nodes.py needs two login nodes behind the SSH port, which
# changes the login node's hostname and /tmp that other tests check: the integration run
# leaves it out, and a second pass switches the cluster to two login nodes (1.5 s), runs
# it, and switches back to one.
set -euo pipefail
cd "$(dirname "$0")/.."
DAGSTER_SLURM_EXTRAS=${DAGSTER_SLURM_EXTRAS:-dev,ray,spark} bash scripts/bootstrap.sh
# The login sites (one-time code, certificates, bastion) for tests/integration/test_login_sites.py.
.venv/bin/dagster-slurm dev-cluster up --login-sites all
.venv/bin/ruff check src tests benchmarks examples docs
# Bytecode caches are kept even where PYTHONDONTWRITEBYTECODE is set: without them every
# pytest worker and every Python subprocess a test starts compiles the package and the test
# modules again (collecting tests/unit takes 16 s instead of 4 s per worker).
unset PYTHONDONTWRITEBYTECODE

# pytest's exit status 5 means it collected nothing: a broken selection, never a pass.
checked() {
    if [ "$1" = 5 ]; then
        echo "test.sh: pytest collected no tests${2:+ in $2}" >&2
        return 1
    fi
    return "$1"
}

set +e
if [ "$#" -gt 0 ]; then
    .venv/bin/python -m pytest "$@"
    checked "$?"
    exit
fi

unit_log=$(mktemp "${TMPDIR:-/tmp}/dagster-slurm-unit.XXXXXX")
trap 'rm -f -- "$unit_log"' EXIT
nice -n 10 .venv/bin/python -m pytest tests/unit -p no:cacheprovider -n 2 >"$unit_log" 2>&1 &
unit_pid=$!
.venv/bin/python -m pytest tests/integration --ignore=tests/integration/test_login_nodes.py
integration_rc=$?
.venv/bin/dagster-slurm dev-cluster up --login-nodes 2 >/dev/null \
    && .venv/bin/python -m pytest tests/integration/test_login_nodes.py
login_nodes_rc=$?
.venv/bin/dagster-slurm dev-cluster up --login-nodes 1 >/dev/null || login_nodes_rc=1
wait "$unit_pid"
unit_rc=$?
echo
echo "==================== unit tests (ran beside the integration tests) ===================="
cat -- "$unit_log"
checked "$integration_rc" tests/integration
integration_rc=$?
checked "$unit_rc" tests/unit
unit_rc=$?
checked "$login_nodes_rc" tests/integration/test_login_nodes.py
login_nodes_rc=$?

bash scripts/second_release.sh
release_rc=$?
[ "$integration_rc" = 0 ] || exit "$integration_rc"
[ "$login_nodes_rc" = 0 ] || exit "$login_nodes_rc"
[ "$unit_rc" = 0 ] || exit "$unit_rc"
exit "$release_rc"
