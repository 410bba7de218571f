"""Where a job's progress lines and output lines go.

:class:`ProgressLog` sends progress lines to a Dagster logger (``context.log``) when one is
given, else to Python ``logging``; :func:`notable_stdout_sink` copies a payload's stdout to
this process's stdout and logs the launcher's notable lines (the Ray dashboard URL, the Spark
master's web UI and their ``ssh -L`` hints, defined once in
:mod:`dagster_slurm.launchers.ray_script` and :mod:`dagster_slurm.launchers.spark`);
:func:`notable_lines` picks the same lines out of a log text.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from dagster_slurm.launchers.ray_script import RAY_NOTABLE_PREFIXES
from dagster_slurm.launchers.spark import SPARK_NOTABLE_PREFIXES

log = logging.getLogger("dagster_slurm.session")

#: Launcher output lines that also go to the Dagster log (not only to the compute logs).
NOTABLE_PREFIXES: tuple[str, ...] = RAY_NOTABLE_PREFIXES + SPARK_NOTABLE_PREFIXES


class ProgressLog:
    """Progress lines to ``logger`` (a Dagster ``context.log`` or any object with ``info``,
    ``warning`` and ``error``); to the ``dagster_slurm.session`` Python logger when
    ``logger`` is None."""

    def __init__(self, logger: Any = None) -> None:
        self.logger = logger

    def emit(self, level: str, message: str) -> None:
        """Send ``message`` at ``level`` (``info``, ``warning`` or ``error``)."""
        getattr(self.logger if self.logger is not None else log, level)(message)

    def info(self, message: str) -> None:
        self.emit("info", message)

    def warning(self, message: str) -> None:
        self.emit("warning", message)

    def error(self, message: str) -> None:
        self.emit("error", message)


def is_notable(line: str) -> bool:
    """True for a launcher line that belongs in the Dagster log (see :data:`NOTABLE_PREFIXES`)."""
    return line.startswith(NOTABLE_PREFIXES)


def notable_lines(text: str) -> list[str]:
    """The notable lines of ``text`` (a job's output), in order, without line ends."""
    return [line for line in text.splitlines() if is_notable(line)]


def notable_stdout_sink(logger: Any) -> Callable[[str], None]:
    """A stdout sink that writes every line to this process's stdout (Dagster's compute
    logs) and also sends the launcher's notable lines, such as the Ray dashboard URL, to
    ``logger.info`` (``logger``: a Dagster ``context.log`` or any object with ``info``)."""

    def sink(line: str) -> None:
        sys.stdout.write(line if line.endswith("\n") else line + "\n")
        if is_notable(line):
            logger.info(line.rstrip("\n"))

    return sink
