"""No module of the package touches an underscore attribute of another object.

Every ``x._name`` under ``src/dagster_slurm`` is refused unless ``x`` is the object itself
(``self``, ``cls``, ``super()``) or a third-party module whose private name the package has
no other way to reach (listed in :data:`THIRD_PARTY`, with the reason). A feature that
needs another object's private state is asking for a public operation on that object.
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src" / "dagster_slurm"

#: ``module._name`` uses of other projects' modules, each with why it stays.
THIRD_PARTY: dict[str, str] = {
    "sys._getframe": "the caller's frame names the field a user misspelt (config_errors)",
    "argparse._SubParsersAction": "the type of argparse's sub-parsers, which it does not export",
    "dagster_resource._curry_config_schema": "the function Dagster's resource constructor "
    "calls to curry its schema with the resource's values, cached per schema and values "
    "(schema_cache); Dagster has no hook for it",
}


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name) and node.id in ("self", "cls"):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "super")


def private_attribute_uses(source: Path = SOURCE) -> list[str]:
    """``path:line: expr._name`` for every underscore attribute of another object."""
    found: list[str] = []
    for path in sorted(source.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or name.startswith("__") or _is_self(node.value):
                continue
            shown = f"{ast.unparse(node.value)}.{name}"
            if shown in THIRD_PARTY:
                continue
            found.append(f"{path.relative_to(source.parent)}:{node.lineno}: {shown}")
    return found


def test_no_module_touches_a_private_attribute_of_another_object() -> None:
    found = private_attribute_uses()
    assert not found, "private attributes of other objects:\n" + "\n".join(found)


def test_a_planted_private_access_is_found(tmp_path: Path) -> None:
    package = tmp_path / "dagster_slurm"
    package.mkdir()
    (package / "feature.py").write_text(
        "import sys\n"
        "def f(session):\n"
        "    sys._getframe(0)\n"
        "    return session._pause\n"
        "class A:\n"
        "    def g(self):\n"
        "        return self._x, super()._y\n",
        encoding="utf-8")
    assert private_attribute_uses(package) == ["dagster_slurm/feature.py:4: session._pause"]
