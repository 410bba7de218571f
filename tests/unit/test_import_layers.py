"""The import-layer contract of the package: lower layers never import higher ones.

Every ``import`` and ``from ... import`` of every module under ``src/dagster_slurm`` counts:
at module level, inside functions, and inside ``if TYPE_CHECKING:`` blocks too (a
type-only import still ties a lower layer to a higher one, and turning it into a runtime
import must not be the moment a cycle appears). Each module belongs to the unit named by
its first component below ``dagster_slurm`` (``jobs/pending.py`` -> ``jobs``,
``errors.py`` -> ``errors``, ``__init__.py`` -> ``dagster_slurm``). A unit may import itself
and the units of strictly lower layers in :data:`LAYERS`; units of one layer do not import
each other. Strict layers leave no import cycle between units. Importing a private name
(``_x``, or a module ``_x``) of another unit is refused as well.

A new subpackage fails the contract until it is given a layer here (and in the diagram of
``docs/design.md``).

Inside a unit with a table of its own in :data:`SUB_LAYERS` (``session``, ``state``) the
same rule holds one level down: each module belongs to the sub-unit named by its first
component below the unit (``session/head/election.py`` -> ``head``, ``state/lease.py`` ->
``lease``; the unit's ``__init__`` stands above every sub-unit), and a sub-unit imports
only itself and lower sub-units. Across the whole package, finally, no module imports an
underscore name of another module, and the modules form no import cycle, counted with every
import (at module level, inside functions, under ``TYPE_CHECKING``): a cycle that is only
deferred to call time is still a cycle of the design.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "dagster_slurm"
SOURCE_ROOT = Path(__file__).resolve().parents[2] / "src"

#: The layers, lowest first; the one table of the contract (drawn in docs/design.md).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "backoff", "protocol", "schema_cache"),
    ("config_errors",),
    ("slurm", "transport"),
    ("agent",),
    ("state", "scheduler"),
    ("pipes", "launchers", "environment", "resources", "ray"),
    ("jobs", "logins"),
    ("session",),
    ("compute",),
    ("devcluster",),
    (PACKAGE, "cli", "testing"),
)


#: Layers inside a unit, lowest first (drawn in docs/design.md for ``session``).
SUB_LAYERS: dict[str, tuple[tuple[str, ...], ...]] = {
    "session": (
        ("core",),
        ("head", "orphans"),
        ("workers",),
        ("scaling",),
        ("supervision",),
        ("session",),
        ("frontend",),
    ),
    "state": (
        ("schema",),
        ("patches",),
        ("store",),
        ("lease",),
        ("transitions",),
        ("successor_transitions", "worker_transitions"),
        ("election_transitions",),
        ("election",),
    ),
}


@dataclass(frozen=True)
class Violation:
    """One import that breaks the contract: where it is and what is wrong with it."""

    path: str
    line: int
    importer: str
    imported: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}: {self.problem}"


def _layer_of(layers: tuple[tuple[str, ...], ...]) -> dict[str, int]:
    return {unit: index for index, layer in enumerate(layers) for unit in layer}


def _module_parts(root: Path, path: Path) -> tuple[list[str], bool]:
    """The dotted name of ``path`` as parts, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return parts[:-1], True
    return parts, False


def _unit(parts: list[str]) -> str:
    return parts[1] if len(parts) > 1 else PACKAGE


def _imports(tree: ast.AST, parts: list[str], is_package: bool):
    """``(line, module, name)`` for every import in ``tree``; ``name`` is None for
    ``import module``; relative imports are resolved against ``parts``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts if is_package else parts[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                yield node.lineno, module, alias.name


def _private(component: str) -> bool:
    return component.startswith("_") and not component.startswith("__")


def check_layers(source_root: Path, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[Violation]:
    """Every import under ``source_root/dagster_slurm`` that breaks the contract (see the
    module docstring); an empty list when the package keeps it."""
    root = Path(source_root)
    rank = _layer_of(layers)
    found: list[Violation] = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts, is_package = _module_parts(root, path)
        importer = _unit(parts)
        where = str(path.relative_to(root))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=where)
        if importer not in rank:
            found.append(Violation(where, 1, importer, "-", "has no layer in LAYERS; add it"))
            continue
        for line, module, name in _imports(tree, parts, is_package):
            target = module.split(".")
            if target[0] != PACKAGE:
                continue
            imported = _unit(target)
            if imported == importer:
                continue
            shown = f"{module}.{name}" if name else module
            if any(_private(part) for part in target[1:]) or (name is not None and _private(name)):
                found.append(Violation(where, line, importer, shown,
                                       f"a private name of {imported}; make it public there"))
            if imported not in rank:
                found.append(Violation(where, line, importer, shown, f"{imported} has no layer"))
            elif rank[imported] >= rank[importer]:
                found.append(Violation(
                    where, line, importer, shown,
                    f"{imported} (layer {rank[imported]}) is not below {importer} "
                    f"(layer {rank[importer]})",
                ))
    return found


def check_sub_layers(source_root: Path,
                     sub_layers: dict[str, tuple[tuple[str, ...], ...]] = SUB_LAYERS
                     ) -> list[Violation]:
    """Every import between two modules of one unit of ``sub_layers`` that breaks its table
    (see the module docstring)."""
    root = Path(source_root)
    found: list[Violation] = []
    for unit, layers in sub_layers.items():
        rank = _layer_of(layers)
        top = len(layers)  # the unit's own __init__ stands above every sub-unit
        for path in sorted((root / PACKAGE / unit).rglob("*.py")):
            parts, is_package = _module_parts(root, path)
            where = str(path.relative_to(root))
            importer = parts[2] if len(parts) > 2 else "__init__"
            if importer != "__init__" and importer not in rank:
                found.append(Violation(where, 1, importer, "-",
                                       f"has no layer in SUB_LAYERS[{unit!r}]; add it"))
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=where)
            for line, module, name in _imports(tree, parts, is_package):
                target = module.split(".")
                if target[:2] != [PACKAGE, unit]:
                    continue
                if len(target) == 2 and name is not None:
                    target = [*target, name]  # from dagster_slurm.unit import module
                imported = target[2] if len(target) > 2 else "__init__"
                if imported == importer or imported not in rank:
                    continue
                own = top if importer == "__init__" else rank[importer]
                if rank[imported] >= own:
                    shown = f"{module}.{name}" if name else module
                    found.append(Violation(
                        where, line, f"{unit}.{importer}", shown,
                        f"{unit}.{imported} (layer {rank[imported]}) is not below "
                        f"{unit}.{importer} (layer {own})"))
    return found


def _module_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, str]]:
    """Every module of the package -> the modules it imports (all imports; ``from p
    import m`` of a submodule ``m`` is an edge to ``p.m``), and each module's path."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts, is_package = _module_parts(root, path)
        modules[".".join(parts)] = (path, is_package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for _line, module, imported in _imports(tree, name.split("."), is_package):
            target = f"{module}.{imported}" if f"{module}.{imported}" in modules else module
            if target in modules and target != name:
                graph[name].add(target)
    return graph, {name: str(path.relative_to(root)) for name, (path, _) in modules.items()}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for child in graph[todo.pop()]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def find_cycles(source_root: Path) -> list[list[str]]:
    """The import cycles of the package (sets of more than one module that all reach each
    other, each sorted), counted with every import; empty when there is none."""
    graph, _paths = _module_graph(Path(source_root))
    reach = {name: _reachable(graph, name) for name in graph}
    cycles: list[list[str]] = []
    placed: set[str] = set()
    for name in sorted(graph):
        if name in placed or name not in reach[name]:
            continue
        members = sorted(other for other in reach[name] if name in reach[other])
        placed.update(members)
        cycles.append(members)
    return cycles


def private_imports(source_root: Path) -> list[Violation]:
    """Every import of an underscore name (or module) of another module of the package."""
    root = Path(source_root)
    found: list[Violation] = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts, is_package = _module_parts(root, path)
        where = str(path.relative_to(root))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=where)
        for line, module, name in _imports(tree, parts, is_package):
            target = module.split(".")
            if target[0] != PACKAGE or target == parts:
                continue
            if any(_private(part) for part in target[1:]) or (name is not None and _private(name)):
                shown = f"{module}.{name}" if name else module
                found.append(Violation(where, line, ".".join(parts), shown,
                                       "a private name of another module; make it public there"))
    return found


def test_the_package_keeps_its_layers() -> None:
    violations = check_layers(SOURCE_ROOT)
    assert not violations, "import-layer contract broken:\n" + "\n".join(map(str, violations))


def test_the_session_and_state_packages_keep_their_layers() -> None:
    violations = check_sub_layers(SOURCE_ROOT)
    assert not violations, "sub-layer contract broken:\n" + "\n".join(map(str, violations))


def test_the_package_has_no_import_cycle() -> None:
    cycles = find_cycles(SOURCE_ROOT)
    assert not cycles, "import cycles (every import counted):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles)


def test_no_module_imports_a_private_name_of_another() -> None:
    violations = private_imports(SOURCE_ROOT)
    assert not violations, "\n".join(map(str, violations))


def test_every_session_and_state_module_has_a_sub_layer() -> None:
    for unit, layers in SUB_LAYERS.items():
        placed = set(_layer_of(layers))
        present = {p.stem if p.suffix == ".py" else p.name
                   for p in (SOURCE_ROOT / PACKAGE / unit).iterdir()
                   if (p.suffix == ".py" and p.stem != "__init__")
                   or (p.is_dir() and (p / "__init__.py").exists())}
        assert present == placed, (unit, sorted(present ^ placed))


def test_every_subpackage_has_a_layer() -> None:
    units = {p.name for p in (SOURCE_ROOT / PACKAGE).iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.stem for p in (SOURCE_ROOT / PACKAGE).glob("*.py") if p.stem != "__init__"}
    placed = set(_layer_of(LAYERS))
    assert units <= placed, f"give these a layer in LAYERS: {sorted(units - placed)}"
    assert {"jobs", "session", "compute"} <= placed


def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_a_planted_back_import_and_private_import_are_reported(tmp_path: Path) -> None:
    _plant(tmp_path, {
        "__init__.py": "",
        "jobs/__init__.py": "",
        "jobs/fine.py": "from dagster_slurm.launchers.base import ComputeLauncher\n",
        "jobs/bad.py": (
            "def later():\n"
            "    from dagster_slurm.compute.resource import ComputeResource\n"
            "    return ComputeResource\n"
        ),
        "session/__init__.py": "",
        "session/bad.py": "from dagster_slurm.compute.x import _private\n",
        "compute/__init__.py": "",
        "compute/x.py": "_private = 1\n",
        "compute/fine.py": "from dagster_slurm.jobs.fine import ComputeLauncher\nfrom . import x\n",
    })
    found = {(v.path, v.imported, v.problem.split(" ")[0]) for v in check_layers(tmp_path)}
    assert found == {
        ("dagster_slurm/jobs/bad.py", "dagster_slurm.compute.resource.ComputeResource", "compute"),
        ("dagster_slurm/session/bad.py", "dagster_slurm.compute.x._private", "a"),
        ("dagster_slurm/session/bad.py", "dagster_slurm.compute.x._private", "compute"),
    }, found


@pytest.mark.parametrize("source", [
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dagster_slurm.session import session\n",
    "from ..session import session\n",
    "import dagster_slurm.session.session\n",
    "from dagster_slurm import ComputeResource\n",
])
def test_type_only_relative_and_plain_back_imports_count(tmp_path: Path, source: str) -> None:
    _plant(tmp_path, {"__init__.py": "", "jobs/__init__.py": "", "jobs/bad.py": source})
    (violation,) = check_layers(tmp_path)
    assert violation.importer == "jobs"
    assert violation.path == "dagster_slurm/jobs/bad.py"
    assert "is not below jobs" in violation.problem


def test_a_unit_without_a_layer_is_reported(tmp_path: Path) -> None:
    _plant(tmp_path, {"__init__.py": "", "extra/__init__.py": "import os\n"})
    (violation,) = check_layers(tmp_path)
    assert violation.importer == "extra" and "no layer" in violation.problem


_SESSION_TREE = {
    "__init__.py": "",
    "session/__init__.py": "",
    "session/core/__init__.py": "",
    "session/head/__init__.py": "",
    "session/workers/__init__.py": "",
}


def test_a_planted_cycle_inside_session_is_refused(tmp_path: Path) -> None:
    _plant(tmp_path, {
        **_SESSION_TREE,
        "session/core/context.py": "from dagster_slurm.session.core import current\n",
        # a function-level import closes the cycle: it counts
        "session/core/current.py": (
            "def later():\n"
            "    from dagster_slurm.session.core.context import SessionContext\n"
            "    return SessionContext\n"
        ),
        "session/head/fine.py": "from dagster_slurm.session.core.context import x\n",
    })
    assert find_cycles(tmp_path) == [[
        "dagster_slurm.session.core.context", "dagster_slurm.session.core.current"]]


def test_a_type_only_cycle_through_the_front_is_refused(tmp_path: Path) -> None:
    _plant(tmp_path, {
        **_SESSION_TREE,
        "session/session.py": "from dagster_slurm.session.head.acquire import acquire\n",
        "session/head/acquire.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from dagster_slurm.session.session import RunSession\n"
        ),
    })
    assert find_cycles(tmp_path) == [[
        "dagster_slurm.session.head.acquire", "dagster_slurm.session.session"]]
    (violation,) = check_sub_layers(tmp_path, {"session": SUB_LAYERS["session"]})
    assert violation.importer == "session.head" and "session.session" in violation.problem


def test_a_feature_importing_a_higher_feature_is_refused(tmp_path: Path) -> None:
    _plant(tmp_path, {
        **_SESSION_TREE,
        "session/head/election.py": "from dagster_slurm.session.workers import keep\n",
        "session/workers/keep.py": "from dagster_slurm.session.head.election import x\n",
    })
    found = check_sub_layers(tmp_path, {"session": SUB_LAYERS["session"]})
    assert [(v.importer, v.imported) for v in found] == [
        ("session.head", "dagster_slurm.session.workers.keep")]


def test_a_private_import_between_modules_of_one_unit_is_refused(tmp_path: Path) -> None:
    _plant(tmp_path, {
        "__init__.py": "", "state/__init__.py": "",
        "state/a.py": "_hidden = 1\n",
        "state/b.py": "from dagster_slurm.state.a import _hidden\n",
    })
    (violation,) = private_imports(tmp_path)
    assert violation.path == "dagster_slurm/state/b.py"
