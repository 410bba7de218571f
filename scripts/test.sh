#!/usr/bin/env bash
# The whole test suite: installs the project into ./.venv, installs and starts the dev
# cluster (real Slurm, MariaDB + slurmdbd, sshd; needs root), then runs pytest.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
DAGSTER_SLURM_EXTRAS=${DAGSTER_SLURM_EXTRAS:-dev,ray,spark} bash scripts/bootstrap.sh
.venv/bin/dagster-slurm dev-cluster up
.venv/bin/ruff check src tests benchmarks examples docs
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
