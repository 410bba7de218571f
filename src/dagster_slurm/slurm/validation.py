"""Validators for values that end up on a Slurm command line.

Every validator takes the name of the configuration field it checks and raises
:class:`~dagster_slurm.errors.ConfigurationError` naming that field and the value. They are
strict on purpose: values reach Slurm as separate argv elements (so a shell never interprets
them), but many of them are also read back from ``squeue`` output or written into batch
scripts by other layers, where a ``|``, a quote or a newline would break things.
"""

from __future__ import annotations

import re
import signal as _signal

from dagster_slurm.errors import ConfigurationError

MAX_JOB_NAME_LENGTH = 200
"""Longest job name accepted (Slurm itself stores more, but ``squeue`` columns get unwieldy)."""

MAX_COMMENT_LENGTH = 1000
"""Longest ``--comment`` accepted."""

MAX_SIGNAL_LEAD_SECONDS = 65535
"""Largest ``@seconds`` lead time ``--signal`` accepts."""

_SLURM_NAME = re.compile(r"[A-Za-z0-9_.,-]+")
_JOB_ID = re.compile(r"[0-9]{1,12}(?:[_+][0-9]{1,12})?")
_MEMORY = re.compile(r"[0-9]{1,15}[KMGTkmgt]?")
_GRES = re.compile(r"[A-Za-z0-9_.:,/=-]+")
_HOSTLIST = re.compile(r"[A-Za-z0-9_.,\[\]-]+")
_SIGNAL_SPEC = re.compile(
    r"(?:(?P<flags>R|B|RB|BR):)?(?P<sig>[A-Za-z0-9]+)(?:@(?P<lead>[0-9]{1,6}))?", re.IGNORECASE
)
_JOB_NAME = re.compile(r"[A-Za-z0-9_.+:@%=-]+")

#: Signal names accepted for ``--signal`` and ``scancel --signal``, without the ``SIG`` prefix.
SIGNAL_NAMES: frozenset[str] = frozenset(
    member.name[3:]
    for member in _signal.Signals
    if member.name.startswith("SIG") and not member.name.startswith("SIG_")
)


def has_control_characters(text: str) -> bool:
    """True when ``text`` contains a C0/C1 control character or DEL (newlines included)."""
    return any(ord(char) < 32 or 127 <= ord(char) < 160 for char in text)


def _require_str(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(field, value, f"must be a string, got {type(value).__name__}")
    if not value:
        raise ConfigurationError(field, value, "must not be empty")
    return value


def validate_job_name(field: str, value: object) -> str:
    """A job name: 1-200 of the characters ``A-Z a-z 0-9 _ . - + : @ % =``.

    This excludes whitespace, quotes, ``/``, ``|`` and ``,`` (which would break ``squeue``
    output parsing and ``--name`` lists), shell metacharacters and control characters.
    """
    text = _require_str(field, value)
    if len(text) > MAX_JOB_NAME_LENGTH:
        raise ConfigurationError(
            field, value, f"is {len(text)} characters long; at most {MAX_JOB_NAME_LENGTH} allowed"
        )
    if _JOB_NAME.fullmatch(text) is None:
        bad = sorted({char for char in text if _JOB_NAME.fullmatch(char) is None})
        shown = ", ".join(repr(char) for char in bad)
        raise ConfigurationError(
            field, value, f"must not contain {shown}; use letters, digits and '_ . - + : @ % ='"
        )
    return text


def validate_slurm_name(field: str, value: object) -> str:
    """A partition, QoS, account or reservation name (letters, digits, ``_ - . ,``).

    A comma separates alternatives (``--partition=cpu,gpu``).
    """
    text = _require_str(field, value)
    if _SLURM_NAME.fullmatch(text) is None:
        raise ConfigurationError(
            field, value, "is not a Slurm name; use only letters, digits and '_', '-', '.', ','"
        )
    return text


def validate_job_id(field: str, value: object) -> str:
    """A job id: digits, optionally ``_<task>`` (array) or ``+<offset>`` (heterogeneous job)."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, int) else None
    if text is None or isinstance(value, bool) or _JOB_ID.fullmatch(text) is None:
        raise ConfigurationError(field, value, "is not a Slurm job id such as '1234' or '1234_5'")
    return text


def validate_count(field: str, value: object, *, minimum: int = 1) -> int:
    """An integer count of at least ``minimum`` (booleans are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(field, value, "must be an integer")
    if value < minimum:
        raise ConfigurationError(field, value, f"must be at least {minimum}")
    return value


def validate_memory(field: str, value: object) -> str:
    """A Slurm memory size: an integer with an optional unit K, M, G or T (default M)."""
    text = _require_str(field, value)
    if _MEMORY.fullmatch(text) is None:
        raise ConfigurationError(
            field, value, "is not a Slurm memory size such as '4096M', '16G' or '500' (MB)"
        )
    return text


def validate_gres(field: str, value: object) -> str:
    """A ``--gres`` request such as ``gpu:2`` or ``gpu:a100:1,shard:1``."""
    text = _require_str(field, value)
    if _GRES.fullmatch(text) is None:
        raise ConfigurationError(field, value, "is not a GRES request such as 'gpu:2'")
    return text


def validate_hostlist(field: str, value: object) -> str:
    """A Slurm host list such as ``c[1-4],g1``."""
    text = _require_str(field, value)
    if _HOSTLIST.fullmatch(text) is None:
        raise ConfigurationError(field, value, "is not a Slurm host list such as 'c[1-4],g1'")
    return text


def validate_text(field: str, value: object, *, max_length: int | None = None) -> str:
    """Free text (comments, paths): no control characters, including newlines."""
    text = _require_str(field, value)
    if has_control_characters(text):
        raise ConfigurationError(field, value, "must not contain control characters or newlines")
    if max_length is not None and len(text) > max_length:
        raise ConfigurationError(field, value, f"is longer than {max_length} characters")
    return text


def validate_export(field: str, value: object) -> str:
    """An ``--export`` value: ``ALL``, ``NONE`` or a comma list, without whitespace."""
    text = validate_text(field, value)
    if any(char.isspace() for char in text):
        raise ConfigurationError(field, value, "must not contain whitespace")
    return text


def _signal_name(field: str, value: object, raw: str) -> str:
    """Normalise a signal number or name (``USR1``, ``SIGUSR1``, ``10``) to Slurm's form."""
    upper = raw.upper()
    if upper.isdigit():
        number = int(upper)
        if not 1 <= number <= 64:
            raise ConfigurationError(field, value, "signal numbers run from 1 to 64")
        return str(number)
    name = upper[3:] if upper.startswith("SIG") else upper
    if name not in SIGNAL_NAMES:
        raise ConfigurationError(field, value, f"unknown signal {raw!r}; use e.g. USR1 or TERM")
    return name


def validate_signal_name(field: str, value: object) -> str:
    """A signal as accepted by ``scancel --signal``: a name (``USR1``/``SIGUSR1``) or number."""
    text = _require_str(field, value)
    return _signal_name(field, value, text)


def validate_sbatch_signal(field: str, value: object) -> str:
    """An ``sbatch --signal`` value ``[{R|B}:]<signal>[@<seconds>]``, normalised.

    ``B:`` signals only the batch shell, ``R:`` keeps the job from being requeued. The lead
    time (0-65535 seconds) defaults to 60 in Slurm when left out; it is kept as written.
    """
    text = _require_str(field, value)
    match = _SIGNAL_SPEC.fullmatch(text)
    if match is None:
        raise ConfigurationError(
            field, value, "is not a Slurm signal spec such as 'B:USR1@60' or 'TERM@120'"
        )
    name = _signal_name(field, value, match.group("sig"))
    flags, lead = match.group("flags"), match.group("lead")
    if lead is not None and int(lead) > MAX_SIGNAL_LEAD_SECONDS:
        raise ConfigurationError(
            field, value, f"the lead time must be at most {MAX_SIGNAL_LEAD_SECONDS} seconds"
        )
    prefix = f"{flags.upper()}:" if flags else ""
    suffix = f"@{int(lead)}" if lead is not None else ""
    return f"{prefix}{name}{suffix}"


def signal_lead_seconds(spec: str) -> int:
    """The lead time of a validated ``--signal`` spec; Slurm's default 60 when none is given."""
    _, _, lead = spec.partition("@")
    return int(lead) if lead else 60
