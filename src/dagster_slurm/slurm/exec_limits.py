"""Sizes of what reaches a program's environment and command line, checked before submission.

Linux refuses to start a program (``execve`` fails with E2BIG, "Argument list too long")

* when one argument or one environment string (``NAME=value``) is longer than
  ``MAX_ARG_STRLEN``: 32 pages, 131072 bytes counted with the terminating NUL, so at most
  131071 bytes of text (:data:`MAX_ARG_STRLEN`);
* when all arguments and environment strings together exceed ``ARG_MAX``: a quarter of the
  stack limit, 2 MiB at the usual ``ulimit -s`` of 8 MiB (each string counted with its NUL,
  plus a pointer per string).

A job script exports the user's ``extra_env``, so every program it starts (``rm``, ``mv``,
``setsid``, ``srun``, the payload) inherits it: one oversized variable makes all of them
fail, and the job ends without a status file. The library cannot know the environment a job
inherits on the cluster (the login environment, Slurm's ``SLURM_*`` variables, a module
system's variables run to tens of KB), so it keeps to budgets that leave room for it:

* :data:`EXTRA_ENV_LIMIT`, 1 MiB for all ``extra_env`` variables together: half of
  ``ARG_MAX`` at the default stack limit;
* :data:`COMMAND_LIMIT`, 256 KiB for the payload's command (all its words together);

which leaves at least 768 KiB of the 2 MiB to the inherited environment. Sizes are bytes of
UTF-8, each string counted with its NUL, as the kernel counts them. Larger data belongs in a
file: the error messages say so (:data:`FILE_ADVICE`).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping

from dagster_slurm.errors import ConfigurationError

MAX_ARG_STRLEN = 131072
"""Linux's limit of one argument or one ``NAME=value`` environment string, in bytes with the
terminating NUL (32 pages of 4 KiB)."""

EXTRA_ENV_LIMIT = 1024 * 1024
"""Bytes all ``extra_env`` variables may take together (``NAME=value`` and a NUL each)."""

COMMAND_LIMIT = 256 * 1024
"""Bytes the words of a payload's command may take together (each with a NUL)."""

FILE_ADVICE = (
    "pass large data through a file instead: write it where the job can read it (the "
    "cluster's shared filesystem) and pass the file's path, or pass it in extras (they "
    "reach the payload in the Pipes context file, not in the environment)"
)
"""What to do instead, ending every size error."""


def _kib(size: int) -> str:
    mib = 1024 * 1024
    return f"{size // mib} MiB" if size % mib == 0 else f"{size // 1024} KiB"


def string_bytes(where: str, value: str, *, shown: object | None = None) -> int:
    """Bytes ``value`` takes in a program's environment or argv: its UTF-8 with the NUL.

    Raises :class:`ConfigurationError` naming ``where`` (showing ``shown``, default
    ``value``) for text that has no UTF-8 form: a lone surrogate, as Python uses for bytes
    of a file name or of ``os.environ`` that are not UTF-8."""
    try:
        return len(value.encode("utf-8")) + 1
    except UnicodeEncodeError as error:
        raise ConfigurationError(
            where, value if shown is None else shown,
            f"cannot be written as UTF-8: character {error.start + 1} is a lone surrogate "
            "(Python's stand-in for a byte that is not UTF-8, as in os.environ or file names "
            "read with surrogateescape); pass valid text",
        ) from None


def check_env_variable(where: str, name: str, value: str) -> int:
    """Bytes of ``NAME=value`` with its NUL; raises :class:`ConfigurationError` naming
    ``where`` (``extra_env['BIG']``) when Linux would refuse it (:data:`MAX_ARG_STRLEN`)."""
    size = len(name.encode("utf-8")) + 1 + string_bytes(where, value)  # NAME, '=', value, NUL
    if size > MAX_ARG_STRLEN:
        raise ConfigurationError(
            where, value,
            f"{name}=<value> takes {size} bytes with its terminating NUL, over Linux's limit "
            f"of {MAX_ARG_STRLEN} bytes ({_kib(MAX_ARG_STRLEN)}, MAX_ARG_STRLEN) for one "
            "environment variable: every program the job starts would fail with 'Argument "
            f"list too long'; {FILE_ADVICE}",
        )
    return size


def check_env_total(field: str, env: Mapping[str, str], sizes: Iterable[int],
                    limit: int = EXTRA_ENV_LIMIT) -> None:
    """Raise :class:`ConfigurationError` naming ``field`` when ``sizes`` (of each of
    ``env``'s variables, from :func:`check_env_variable`) add up to more than ``limit``."""
    total = sum(sizes)
    if total > limit:
        raise ConfigurationError(
            field, env,
            f"the {len(env)} variables take {total} bytes together (NAME=value and a NUL "
            f"each), over the {limit} bytes ({_kib(limit)}) dagster-slurm allows for "
            f"{field}: Linux refuses to start a program whose arguments and environment "
            "together exceed ARG_MAX (2 MiB at the usual 8 MiB stack limit), and the "
            f"environment the job inherits on the cluster needs the rest; {FILE_ADVICE}",
        )


def _too_long(subject: str, size: int) -> str:
    return (f"{subject} takes {size} bytes with its terminating NUL, over Linux's limit of "
            f"{MAX_ARG_STRLEN} bytes ({_kib(MAX_ARG_STRLEN)}, MAX_ARG_STRLEN) for one "
            "argument: the program would fail to start with 'Argument list too long'; "
            + FILE_ADVICE)


def check_arguments(field: str, words: Iterable[str], *, shown: object,
                    limit: int = COMMAND_LIMIT) -> None:
    """Raise :class:`ConfigurationError` naming ``field`` (showing ``shown``) when one of
    ``words`` (a command's argv) is longer than :data:`MAX_ARG_STRLEN` or all together take
    more than ``limit`` bytes."""
    words = list(words)
    total = 0
    for index, word in enumerate(words, 1):
        size = string_bytes(field, word, shown=shown)
        if size > MAX_ARG_STRLEN:
            raise ConfigurationError(
                field, shown, _too_long(f"word {index} of {len(words)} of the command", size)
            )
        total += size
    if total > limit:
        raise ConfigurationError(
            field, shown,
            f"the words of the command take {total} bytes together, over the {limit} bytes "
            f"({_kib(limit)}) dagster-slurm allows for a command (Linux's ARG_MAX, 2 MiB at "
            f"the usual stack limit, is shared with the job's environment); {FILE_ADVICE}",
        )


def check_command(field: str, command: str) -> None:
    """:func:`check_arguments` for ``command``, a command line as a user writes it
    (``payload_path``): split like a shell would, or at whitespace when it cannot be."""
    if len(command) * 4 < MAX_ARG_STRLEN:  # fits even if every character took 4 bytes
        string_bytes(field, command)
        return
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    check_arguments(field, words, shown=command)


def check_argument(field: str, value: str) -> None:
    """Raise :class:`ConfigurationError` naming ``field`` when ``value``, one argument of a
    command on the cluster, is longer than Linux allows (:data:`MAX_ARG_STRLEN`)."""
    size = string_bytes(field, value)
    if size > MAX_ARG_STRLEN:
        raise ConfigurationError(field, value, _too_long("the value", size))
