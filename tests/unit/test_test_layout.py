"""The test tree itself: pytest imports test modules by their base name (no packages), so
two test files with the same name in different directories break collection of the suite."""

from collections import Counter
from pathlib import Path


def test_every_test_module_name_is_unique() -> None:
    root = Path(__file__).resolve().parents[1]
    names = Counter(path.name for path in root.rglob("test_*.py"))
    assert not [name for name, count in names.items() if count > 1]
