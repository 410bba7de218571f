"""Which of the example's optional assets can run on this machine, and why the others cannot.

The Bash and Python assets need nothing beyond dagster-slurm. ``ray_sum`` needs ``ray``;
``spark_sum`` needs a dagster-slurm with ``SparkLauncher``, ``pyspark`` and a Java runtime.
An asset whose needs are not met is left out of the project, and :func:`skipped_line` is the
one line that says so (``run_example.py`` prints it). The checks take their probes as
arguments, so that each reason can be shown without changing what is installed.

In Slurm mode the checks look at this machine: the payload's environment on the cluster is
packed from the versions installed here, and Java is expected where the job runs too.
"""

import importlib.util
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FindSpec = Callable[[str], Any]
Which = Callable[[str], str | None]


@dataclass(frozen=True)
class Skipped:
    """An asset left out of the project: its name and why, in words a user can act on."""

    asset: str
    reason: str


def ray_missing(find_spec: FindSpec = importlib.util.find_spec) -> str | None:
    """Why ``ray_sum`` cannot run here; None when it can."""
    if find_spec("ray") is None:
        return "ray is not installed (pip install 'dagster-slurm[ray]')"
    return None


def java_missing(which: Which = shutil.which,
                 environ: Mapping[str, str] = os.environ) -> str | None:
    """Why Spark would find no Java runtime; None when ``$JAVA_HOME/bin/java`` exists or
    ``java`` is on ``PATH`` (where PySpark looks for it)."""
    home = environ.get("JAVA_HOME")
    if home and os.path.isfile(os.path.join(home, "bin", "java")):
        return None
    if which("java") is not None:
        return None
    return "no Java runtime (java is not on PATH and JAVA_HOME names none)"


def spark_missing(spark_launcher: type | None, find_spec: FindSpec = importlib.util.find_spec,
                  which: Which = shutil.which,
                  environ: Mapping[str, str] = os.environ) -> str | None:
    """Why ``spark_sum`` cannot run here; None when it can. ``spark_launcher``: the
    ``SparkLauncher`` class, or None when this dagster-slurm has none."""
    if spark_launcher is None:
        return "this dagster-slurm has no SparkLauncher"
    if find_spec("pyspark") is None:
        return "pyspark is not installed (pip install pyspark)"
    return java_missing(which, environ)


def skipped_line(skipped: Iterable[Skipped]) -> str:
    """One line naming every skipped asset with its reason ('' when none was skipped)."""
    parts = [f"{item.asset} ({item.reason})" for item in skipped]
    return f"skipped: {'; '.join(parts)}" if parts else ""
