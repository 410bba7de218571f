#!/usr/bin/env bash
# Create ./.venv with the project installed (editable) and its test tools.
# Works on a fresh Debian/Ubuntu machine with python3; as root it installs python3-venv
# when the interpreter lacks the venv module.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${DAGSTER_SLURM_EXTRAS:-dev}

if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "bootstrap: installing python3-venv"
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv >/dev/null
    else
        echo "bootstrap: $PYTHON has no venv module; install python3-venv (apt-get install python3-venv)" >&2
        exit 1
    fi
fi
if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-$EXTRAS
if [ ! -f "$stamp" ]; then
    echo "bootstrap: installing dagster-slurm[$EXTRAS] into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[$EXTRAS]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi
