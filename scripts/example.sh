#!/usr/bin/env bash
# Materialize the example project (examples/). Local mode by default: no cluster needed.
# DAGSTER_SLURM_MODE=slurm runs it on the cluster named by the SLURM_EDGE_NODE_* variables.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export DAGSTER_HOME=${DAGSTER_HOME:-$PWD/.dagster_home}
mkdir -p "$DAGSTER_HOME"
PYTHONPATH=examples${PYTHONPATH:+:$PYTHONPATH} exec .venv/bin/python examples/run_example.py
