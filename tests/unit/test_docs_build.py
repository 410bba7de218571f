"""The documentation builds with warnings as errors, and its generated reference is complete.

mkdocs is part of the dev extra, so a missing mkdocs fails these tests instead of skipping
them. The build runs without ``--quiet``: mkdocs 1.6 drops warnings at that log level, and
``--strict`` then no longer fails on them.
"""

from __future__ import annotations

import html
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "mkdocs.yml"
HOOK = ROOT / "docs" / "hooks" / "config_reference.py"
REFERENCE_HTML = Path("reference") / "configuration" / "index.html"


def _require_mkdocs() -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail(
            f"mkdocs is not installed for {sys.executable}; it is part of the dev extra "
            "(pip install -e '.[dev]')",
            pytrace=False,
        )


def _load_hook() -> ModuleType:
    _require_mkdocs()
    spec = importlib.util.spec_from_file_location("docs_config_reference_hook", HOOK)
    assert spec is not None and spec.loader is not None, f"cannot load {HOOK}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Build:
    returncode: int
    output: str
    site: Path

    def check(self) -> None:
        _require_mkdocs()
        assert self.returncode == 0, f"mkdocs build --strict failed:\n{self.output}"

    def reference(self) -> str:
        self.check()
        return (self.site / REFERENCE_HTML).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    site = tmp_path_factory.mktemp("site")
    if importlib.util.find_spec("mkdocs") is None:  # each test then fails with the reason
        return Build(-1, "mkdocs is not installed", site)
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    argv += ["--config-file", str(CONFIG), "--site-dir", str(site)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    return Build(proc.returncode, proc.stdout + proc.stderr, site)


def _section(page: str, anchor: str) -> str:
    """The HTML from the ``<h2>`` with id ``anchor`` up to the next ``<h2>``."""
    start = page.index(f'<h2 id="{anchor}"')
    end = page.find("<h2", start + 1)
    return page[start : end if end != -1 else len(page)]


def _field_names(section: str) -> list[str]:
    """First-column names of the field table in ``section``."""
    return re.findall(r"<tr>\s*<td><code>([^<]+)</code></td>", section)


def test_docs_build_strict(build: Build) -> None:
    build.check()
    assert "WARNING" not in build.output, build.output
    assert (build.site / "index.html").is_file()
    assert not (build.site / "hooks").exists(), "the build hooks must not be published"


def test_reference_has_every_listed_class(build: Build) -> None:
    page = build.reference()
    hook = _load_hook()
    assert hook.MARKER not in page
    assert hook.REFERENCE_CLASSES, "the reference lists no classes"
    for path in hook.REFERENCE_CLASSES:
        module, _, name = path.rpartition(".")
        section = _section(page, name.lower())
        assert f"from {module} import {name}" in html.unescape(section)
        cls = hook.load_class(path)
        assert _field_names(section) == list(cls.model_fields), path


def test_reference_has_every_field_of_ssh_connection_resource(build: Build) -> None:
    from dagster_slurm.resources.ssh import SSHConnectionResource

    section = html.unescape(_section(build.reference(), "sshconnectionresource"))
    assert set(_field_names(section)) == set(SSHConnectionResource.model_fields)
    for name, field in SSHConnectionResource.model_fields.items():
        assert field.description, name
        assert " ".join(field.description.split()) in section, name


def _public_config_classes() -> dict[str, type]:
    """Public classes of the package that carry configuration: pydantic models with fields."""
    import dagster_slurm

    found = {}
    for name in dagster_slurm.__all__:
        value = getattr(dagster_slurm, name)
        if isinstance(value, type) and issubclass(value, BaseModel) and value.model_fields:
            found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_reference_lists_every_public_configuration_class() -> None:
    hook = _load_hook()
    public = _public_config_classes()
    for path in (
        "dagster_slurm.resources.ssh.SSHConnectionResource",
        "dagster_slurm.slurm.queue.SlurmQueueConfig",
        "dagster_slurm.resources.slurm.SlurmResource",
        "dagster_slurm.compute.resource.ComputeResource",
        "dagster_slurm.launchers.bash.BashLauncher",
    ):
        assert path in public, f"{path} is no longer exported by dagster_slurm"
    missing = sorted(set(public) - set(hook.REFERENCE_CLASSES))
    assert not missing, f"add to REFERENCE_CLASSES in {HOOK.name}: {missing}"


def test_reference_summarises_long_mapping_defaults(build: Build) -> None:
    from dagster_slurm.jobs.pending import DEFAULT_FATAL_REASONS

    section = html.unescape(_section(build.reference(), "computeresource"))
    assert f"{len(DEFAULT_FATAL_REASONS)} entries:" in section
    for reason, advice in DEFAULT_FATAL_REASONS.items():
        assert reason in section, reason
        assert advice not in section, "the advice texts belong on the modes page, not in a cell"


def _page(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def test_modes_page_names_every_error_key_and_reason() -> None:
    """The modes page lists what the code defines; a new error, key or reason needs a line."""
    from dagster_slurm.compute.options import OPTION_FIELDS
    from dagster_slurm.errors import DagsterSlurmError
    from dagster_slurm.jobs import errors
    from dagster_slurm.jobs.metrics import METADATA_KEYS
    from dagster_slurm.jobs.pending import DEFAULT_FATAL_REASONS

    page = _page("modes.md")
    error_classes = [
        value
        for value in vars(errors).values()
        if isinstance(value, type)
        and issubclass(value, DagsterSlurmError)
        and value.__module__ == errors.__name__
        and value is not errors.SlurmJobError
    ]
    assert error_classes
    names = [cls.__name__ for cls in error_classes]
    names += list(METADATA_KEYS) + list(OPTION_FIELDS) + list(DEFAULT_FATAL_REASONS)
    missing = [name for name in names if f"`{name}`" not in page]
    assert not missing, f"docs/modes.md does not mention: {missing}"


def test_launchers_page_lists_the_exit_codes_of_the_job_script() -> None:
    template_path = ROOT / "src" / "dagster_slurm" / "templates" / "job_common.sh"
    template = template_path.read_text(encoding="utf-8")
    codes = set(re.findall(r"__ds_finish (12[0-9])\b", template))
    assert codes, "no fixed exit codes found in job_common.sh"
    page = _page("launchers.md")
    missing = sorted(code for code in codes if f"| {code} |" not in page)
    assert not missing, f"docs/launchers.md does not list the exit codes {missing}"


def test_an_unimportable_class_fails_the_build() -> None:
    hook = _load_hook()
    with pytest.raises(hook.PluginError, match="cannot import module 'dagster_slurm.not_here'"):
        hook.render_reference(("dagster_slurm.not_here.Missing",))
    with pytest.raises(hook.PluginError, match="has no attribute 'Missing'"):
        hook.render_reference(("dagster_slurm.resources.ssh.Missing",))
    with pytest.raises(hook.PluginError, match="not a pydantic model"):
        hook.render_reference(("dagster_slurm.errors.ConfigurationError",))


class _Documented(BaseModel):
    """A model for the renderer."""

    size: int | None = Field(default=None, description="Size; `a | b` stays code, x | y is escaped.")
    names: list[str] = Field(default_factory=list, description="Names.")


class _Undocumented(BaseModel):
    """A model with a field that has no description."""

    size: int = 1


class _LongDefault(BaseModel):
    """A model with a mapping default too long for one cell."""

    limits: dict[str, str] = Field(
        default_factory=lambda: {f"key{i}": "x" * 20 for i in range(5)}, description="Limits."
    )
    short: dict[str, int] = Field(default_factory=lambda: {"a": 1}, description="Short.")


def test_renderer_summarises_long_mapping_defaults() -> None:
    hook = _load_hook()
    text = hook.render_class("tests.LongDefault", _LongDefault, ["_LongDefault"])
    keys = ", ".join(f"`key{i}`" for i in range(5))
    assert f"| `limits` | `dict[str, str]` | 5 entries: {keys} | Limits. |" in text
    assert "| `short` | `dict[str, int]` | `{'a': 1}` | Short. |" in text


def test_renderer_formats_fields_and_refuses_missing_descriptions() -> None:
    hook = _load_hook()
    text = hook.render_class("tests.Documented", _Documented, ["_Documented"])
    assert "| `size` | `int | None` | `None` | Size; `a | b` stays code, x \\| y is escaped. |" in text
    assert "| `names` | `list[str]` | `[]` | Names. |" in text
    with pytest.raises(hook.PluginError, match="size has no description"):
        hook.render_class("tests.Undocumented", _Undocumented, [])
