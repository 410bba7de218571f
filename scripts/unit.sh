#!/usr/bin/env bash
# The unit tests alone (tests/unit): no cluster, no root. Creates ./.venv like test.sh, then
# runs pytest on UNIT_WORKERS pytest-xdist workers (default 4: on a 2-core machine the
# tests that wait on a real-time script leave a core idle with only two). Extra arguments
# go to pytest (e.g. -k, -x, --durations=20).
#
# Bytecode caches are kept even where PYTHONDONTWRITEBYTECODE is set: without them every
# worker compiles and assertion-rewrites the ~500 test modules again (16 s against 4 s of
# collection per worker), and every subprocess a test starts compiles the package again.
set -euo pipefail
cd "$(dirname "$0")/.."
DAGSTER_SLURM_EXTRAS=${DAGSTER_SLURM_EXTRAS:-dev,ray,spark} bash scripts/bootstrap.sh
unset PYTHONDONTWRITEBYTECODE
exec .venv/bin/python -m pytest tests/unit -p no:cacheprovider -n "${UNIT_WORKERS:-4}" "$@"
