"""The ``dagster-slurm`` command line.

Each command group lives in its own module and is listed in :data:`COMMAND_MODULES`.
Such a module defines ``register(subparsers)``, which adds its parser(s) and sets the
default ``handler``: a callable taking the parsed arguments and returning the exit
code. This file only assembles the parser and turns library errors into messages.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from dagster_slurm.errors import DagsterSlurmError

#: Modules providing ``register(subparsers)``, in the order shown by ``--help``.
COMMAND_MODULES: tuple[str, ...] = (
    "dagster_slurm.logins.commands",
    "dagster_slurm.devcluster.commands",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered command group."""
    parser = argparse.ArgumentParser(
        prog="dagster-slurm",
        description="Run Dagster assets on Slurm clusters over SSH.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the command, return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except DagsterSlurmError as exc:
        print(f"dagster-slurm: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dagster-slurm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
