"""The README's first command: the example project materializes in local mode."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_example_project_runs_locally(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "examples"),
        "DAGSTER_SLURM_MODE": "local",
        "DAGSTER_HOME": str(tmp_path),
        "DAGSTER_SLURM_LOCAL_BASE": str(tmp_path / "runs"),
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "run_example.py")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run succeeded" in proc.stdout
    assert "check squares_are_positive: passed" in proc.stdout
    assert "materialized squares" in proc.stdout
