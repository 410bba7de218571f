from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_support import JobFiles, kill_leftovers


@pytest.fixture
def job(tmp_path: Path) -> Iterator[JobFiles]:
    """The files of one test job under ``tmp_path``; a leftover payload is killed after."""
    files = JobFiles.under(tmp_path)
    yield files
    kill_leftovers(files)
