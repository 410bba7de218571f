"""The patch language of state transactions: RFC 6901 pointers and a JSON-Patch-like op list.

Pure functions, stdlib only, Python 3.8+. The agent applies patches on the login node and the
library applies the very same code to in-memory documents, so both behave identically.

Pointers (RFC 6901): ``""`` is the whole document, ``"/workers/123/drain_deadline"`` walks
object members and array indices; ``~1`` stands for ``/`` and ``~0`` for ``~`` inside a token.
Array indices are decimal without leading zeros; ``-`` names the slot after the last element
(only ``add`` accepts it). :func:`make_pointer` escapes tokens.

Operations (JSON objects with ``op`` and ``path``):

========== ================================================================================
test       the value at ``path`` exists and equals ``value`` (JSON equality: ``true`` is not
           ``1``). With ``cmp`` (``eq ne lt le gt ge``) the stored value is compared with
           ``value``; ordering comparisons need two numbers or two strings.
absent     nothing exists at ``path``, or ``null`` (an empty optional record, as the
           session document keeps them).
add        RFC 6902 add: sets an object member (replacing it), inserts into an array, or
           replaces the document (``""``). The parent must exist.
replace    the value at ``path`` must exist and is replaced.
remove     the value at ``path`` must exist (unless ``"missing_ok": true``) and is removed.
incr       adds ``value`` to the number at ``path``; a missing member counts as ``0``.
setdefault adds ``value`` when ``path`` does not exist; otherwise changes nothing.
max        sets the number at ``path`` to ``max(current, value)``; missing means ``value``.
========== ================================================================================

Values: ``"value"`` is taken literally. ``"value_now": x`` instead means ``now + x`` where
``now`` is the clock reading passed to :func:`apply_patch` — in a transaction, the login
node's clock at the moment the lock is held (leases and deadlines use it).

Guarantees:

* All or nothing: :func:`apply_patch` never mutates its input and returns a new document only
  when every operation succeeded.
* A failing ``test``/``absent`` raises :class:`PatchConflict` (a *conflict*: the document is
  not in the state the caller expected); every other problem (missing parent, bad index,
  wrong type, malformed op) raises :class:`PatchError`. Both name the op index.

Non-guarantees: no ``move``/``copy``; integers and floats compare numerically (``1 == 1.0``).
"""

from __future__ import annotations

import copy
from typing import Any

_MISSING = object()
_CMPS = ("eq", "ne", "lt", "le", "gt", "ge")
OPS = ("test", "absent", "add", "replace", "remove", "incr", "setdefault", "max")


class PatchError(Exception):
    """A patch operation could not be applied; ``index`` is its position in the patch."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"patch op {index}: {message}")
        self.index = index
        self.detail = message


class PatchConflict(PatchError):
    """A ``test`` or ``absent`` operation failed: the document is not as the caller expected."""

    def __init__(self, index: int, op: dict, reason: str, actual: Any = _MISSING) -> None:
        super().__init__(index, reason)
        self.op = op
        self.actual = actual

    def to_dict(self) -> dict:
        """JSON form: ``index``, ``op``, ``path``, ``reason``, ``exists`` and ``actual``."""
        exists = self.actual is not _MISSING
        return {
            "index": self.index,
            "op": self.op,
            "path": self.op.get("path"),
            "reason": self.detail,
            "exists": exists,
            "actual": self.actual if exists else None,
        }


def escape_token(token: Any) -> str:
    """One pointer token: ``~`` becomes ``~0`` and ``/`` becomes ``~1``."""
    return str(token).replace("~", "~0").replace("/", "~1")


def make_pointer(*tokens: Any) -> str:
    """A pointer from raw tokens, escaped: ``make_pointer("workers", 12)`` is ``/workers/12``."""
    return "".join("/" + escape_token(t) for t in tokens)


def parse_pointer(pointer: Any) -> list:
    """The unescaped tokens of ``pointer``; raises ``ValueError`` if it is not a pointer."""
    if not isinstance(pointer, str):
        raise ValueError(f"pointer must be a string, got {type(pointer).__name__}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"pointer {pointer!r} must be empty or start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: booleans never equal numbers; containers compare deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) or _is_number(b):
        return _is_number(a) and _is_number(b) and a == b
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(json_equal(v, b[k]) for k, v in a.items())
        )
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(json_equal, a, b))
    return type(a) is type(b) and a == b


def get_path(doc: Any, pointer: str, default: Any = None) -> Any:
    """The value at ``pointer`` in ``doc``, or ``default`` when nothing is there."""
    value = _lookup(doc, parse_pointer(pointer))
    return default if value is _MISSING else value


def apply_patch(doc: Any, patch: Any, now: float | None = None) -> Any:
    """Apply ``patch`` to a copy of ``doc`` and return the copy (see the module docstring).

    ``now`` is required only by operations that use ``value_now``.
    """
    if not isinstance(patch, list):
        raise PatchError(0, "patch must be a list of operations")
    work = copy.deepcopy(doc)
    for index, op in enumerate(patch):
        work = _apply_one(work, index, op, now)
    return work


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _apply_one(doc: Any, index: int, op: Any, now: float | None) -> Any:
    if not isinstance(op, dict) or op.get("op") not in OPS:
        raise PatchError(index, f"unknown or malformed operation {op!r}")
    try:
        tokens = parse_pointer(op.get("path"))
    except ValueError as exc:
        raise PatchError(index, str(exc)) from None
    kind = op["op"]
    current = _lookup(doc, tokens)
    if kind == "test":
        _check_test(index, op, current, _value(index, op, now))
        return doc
    if kind == "absent":
        if current is not _MISSING and current is not None:
            raise PatchConflict(index, op, "path exists", current)
        return doc
    if kind == "remove":
        if current is _MISSING:
            if op.get("missing_ok") is True:
                return doc
            raise PatchError(index, f"nothing to remove at {op['path']!r}")
        return _remove(doc, tokens, index)
    if kind == "replace" and current is _MISSING:
        raise PatchError(index, f"nothing to replace at {op['path']!r}")
    if kind == "setdefault" and current is not _MISSING:
        return doc
    value = _value(index, op, now)
    if kind in ("incr", "max"):
        value = _combine(index, kind, current, value)
    return _set(doc, tokens, value, index, insert=(kind == "add"))


def _value(index: int, op: dict, now: float | None) -> Any:
    if "value_now" in op:
        offset = op["value_now"]
        if not _is_number(offset):
            raise PatchError(index, "value_now must be a number of seconds")
        if now is None:
            raise PatchError(index, "value_now needs a clock reading")
        return now + offset
    if "value" not in op:
        raise PatchError(index, f"operation {op['op']!r} needs 'value' or 'value_now'")
    return copy.deepcopy(op["value"])


def _check_test(index: int, op: dict, current: Any, expected: Any) -> None:
    cmp = op.get("cmp", "eq")
    if cmp not in _CMPS:
        raise PatchError(index, f"cmp must be one of {', '.join(_CMPS)}")
    if current is _MISSING:
        raise PatchConflict(index, op, "path does not exist")
    if cmp in ("eq", "ne"):
        if json_equal(current, expected) != (cmp == "eq"):
            raise PatchConflict(index, op, f"value is not {cmp} the expected value", current)
        return
    comparable = (_is_number(current) and _is_number(expected)) or (
        isinstance(current, str) and isinstance(expected, str)
    )
    if not comparable:
        raise PatchConflict(index, op, f"value cannot be ordered against {expected!r}", current)
    holds = {
        "lt": current < expected,
        "le": current <= expected,
        "gt": current > expected,
        "ge": current >= expected,
    }[cmp]
    if not holds:
        raise PatchConflict(index, op, f"value is not {cmp} {expected!r}", current)


def _combine(index: int, kind: str, current: Any, value: Any) -> Any:
    if not _is_number(value):
        raise PatchError(index, f"{kind} needs a number value")
    if current is _MISSING:
        return value
    if not _is_number(current):
        raise PatchError(index, f"{kind} target holds {type(current).__name__}, not a number")
    return current + value if kind == "incr" else max(current, value)


def _lookup(doc: Any, tokens: list) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                return _MISSING
            node = node[token]
        elif isinstance(node, list):
            i = _array_index(token, len(node), allow_end=False)
            if i is None:
                return _MISSING
            node = node[i]
        else:
            return _MISSING
    return node


def _array_index(token: str, length: int, allow_end: bool) -> int | None:
    if token == "-":
        return length if allow_end else None
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        return None
    i = int(token)
    limit = length if allow_end else length - 1
    return i if i <= limit else None


def _parent(doc: Any, tokens: list, index: int) -> Any:
    parent = _lookup(doc, tokens[:-1])
    if parent is _MISSING:
        raise PatchError(index, f"parent of {make_pointer(*tokens)!r} does not exist")
    if not isinstance(parent, (dict, list)):
        raise PatchError(index, f"parent of {make_pointer(*tokens)!r} is not a container")
    return parent


def _set(doc: Any, tokens: list, value: Any, index: int, insert: bool) -> Any:
    if not tokens:
        return value
    parent = _parent(doc, tokens, index)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
        return doc
    i = _array_index(last, len(parent), allow_end=insert)
    if i is None:
        raise PatchError(index, f"bad array index {last!r} in {make_pointer(*tokens)!r}")
    if insert:
        parent.insert(i, value)
    else:
        parent[i] = value
    return doc


def _remove(doc: Any, tokens: list, index: int) -> Any:
    if not tokens:
        raise PatchError(index, "cannot remove the whole document")
    parent = _parent(doc, tokens, index)
    if isinstance(parent, dict):
        del parent[tokens[-1]]
    else:
        i = _array_index(tokens[-1], len(parent), allow_end=False)
        if i is None:
            raise PatchError(index, f"bad array index in {make_pointer(*tokens)!r}")
        del parent[i]
    return doc
