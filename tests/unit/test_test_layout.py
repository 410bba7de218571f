"""The test tree itself: pytest imports test modules by their base name (no packages), with
their directory on ``sys.path``, so two test files with the same name in different
directories break collection of the suite, and so do two support modules (``*_support.py``,
``*_stubs.py`` ...) of the same name: the first one imported is the one every test gets.
Helpers that several test modules share live in support modules, never in a test module
that others import."""

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: An import of a test module, also inside the scripts tests write for other processes.
IMPORTS_A_TEST_MODULE = re.compile(r"^\s*(?:from|import)\s+(test_\w+)", re.MULTILINE)


def test_every_test_module_name_is_unique() -> None:
    names = Counter(path.name for path in ROOT.rglob("test_*.py"))
    assert not [name for name, count in names.items() if count > 1]


def test_every_module_beside_the_tests_has_a_unique_name() -> None:
    directories = {path.parent for path in ROOT.rglob("test_*.py")}
    names = Counter(path.name for directory in directories for path in directory.glob("*.py")
                    if path.name != "conftest.py")
    assert not [name for name, count in names.items() if count > 1]


def test_no_test_module_imports_another_test_module() -> None:
    found = [f"{path.relative_to(ROOT)}: {match.group(1)}"
             for path in sorted(ROOT.rglob("*.py"))
             for match in IMPORTS_A_TEST_MODULE.finditer(path.read_text())]
    assert not found
