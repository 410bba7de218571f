#!/usr/bin/env bash
# The release_subset integration tests against a dev cluster of the other Slurm release
# (24.11 on Debian 12, 22.05 on Debian 13; SECOND_SLURM_RELEASE overrides it, "none" skips
# this), in state directory /tmp/dslurm-2411 with port offset 1000. The cluster is stopped
# again at the end only if this script started it. Run by scripts/test.sh after the main
# test run; PYTHON names the interpreter with the project installed (default .venv's).
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}

release=${SECOND_SLURM_RELEASE:-}
if [ -z "$release" ]; then
    case "$(cut -d. -f1 /etc/debian_version 2>/dev/null)" in
        12) release=24.11 ;;
        13) release=22.05 ;;
        *) release=none ;;
    esac
fi
if [ "$release" = none ]; then
    echo "second_release.sh: no second Slurm release on this machine, skipped"
    exit 0
fi

echo
echo "==================== Slurm $release: tests marked release_subset ===================="
export DAGSTER_SLURM_DEV_STATE_DIR=/tmp/dslurm-2411 DAGSTER_SLURM_DEV_PORT_OFFSET=1000
cluster=("$python" -m dagster_slurm.cli dev-cluster)
started=0
"${cluster[@]}" status >/dev/null 2>&1 || started=1
began=$SECONDS
"${cluster[@]}" up --slurm-release "$release" --login-sites none
rc=$?
echo "second_release.sh: cluster up took $((SECONDS - began)) s (exit status $rc)"
if [ "$rc" = 0 ]; then
    began=$SECONDS
    "$python" -m pytest -m release_subset tests/integration -p no:cacheprovider
    rc=$?
    echo "second_release.sh: release_subset took $((SECONDS - began)) s (exit status $rc)"
    # pytest's exit status 5 means it collected nothing: a broken selection, never a pass.
    if [ "$rc" = 5 ]; then
        echo "second_release.sh: pytest collected no tests marked release_subset" >&2
        rc=1
    fi
fi
if [ "$started" = 1 ]; then
    "${cluster[@]}" down
fi
exit "$rc"
