"""MkDocs hook: generates the configuration reference from the library's config classes.

``docs/reference/configuration.md`` holds an introduction and the line ``MARKER``. At build
time this hook replaces that line with one section per class of ``REFERENCE_CLASSES``: its
import path, its docstring and a table of its fields (name, type, default and the text of
``Field(description=...)``). Nothing generated is committed.

To document another class, add its dotted path to ``REFERENCE_CLASSES``. The build fails,
rather than leaving a class out, when a path does not import, names something that is not a
pydantic model, or when the class or one of its fields has no description.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from mkdocs.exceptions import PluginError
from pydantic import BaseModel

#: Classes documented on the configuration reference page, in page order.
REFERENCE_CLASSES: tuple[str, ...] = (
    "dagster_slurm.resources.ssh.SSHConnectionResource",
    "dagster_slurm.slurm.queue.SlurmQueueConfig",
    "dagster_slurm.resources.slurm.SlurmResource",
    "dagster_slurm.compute.resource.ComputeResource",
    "dagster_slurm.compute.run_config.SlurmRunConfig",
    "dagster_slurm.launchers.bash.BashLauncher",
    "dagster_slurm.launchers.ray.RayLauncher",
    "dagster_slurm.launchers.ray_ports.RayPortConfig",
    "dagster_slurm.launchers.spark.SparkLauncher",
    "dagster_slurm.session.core.config.SlurmRunAllocationConfig",
    "dagster_slurm.session.core.worker_config.SlurmWorkerAllocationConfig",
    "dagster_slurm.session.frontend.resource.SlurmSessionResource",
    "dagster_slurm.compute.hetjob.HetJobComponent",
)

#: Page (relative to ``docs_dir``) that receives the reference.
REFERENCE_PAGE = "reference/configuration.md"

#: Line of ``REFERENCE_PAGE`` replaced by the generated sections.
MARKER = "<!-- configuration-reference -->"

#: Longest default shown in full; a longer mapping is shown by its keys instead.
MAX_DEFAULT_CHARS = 80

_ROLE_WITH_TITLE = re.compile(r":[a-z]+:`([^`<]+?)\s*<[^`>]+>`")
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_SHORT_ROLE = re.compile(r":[a-z]+:`~(?:[\w.]*\.)?(\w+)`")
_DOUBLE_TICKS = re.compile(r"``(.+?)``", re.DOTALL)


def _fail(message: str) -> PluginError:
    return PluginError(f"configuration reference: {message}")


def load_class(path: str) -> type:
    """Import the pydantic model class named by the dotted ``path``.

    Raises :class:`~mkdocs.exceptions.PluginError` (which aborts the build) when the module
    does not import, has no such attribute, or the attribute is not a pydantic model.
    """
    module_name, _, attribute = path.rpartition(".")
    if not module_name:
        raise _fail(f"{path!r} is not a dotted path such as 'package.module.Class'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure must stop the build, with its cause
        raise _fail(f"cannot import module {module_name!r} for {path!r}: {exc!r}") from exc
    try:
        cls = getattr(module, attribute)
    except AttributeError:
        raise _fail(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        raise _fail(f"{path!r} is not a pydantic model class (got {cls!r})")
    return cls


def rst_to_markdown(text: str) -> str:
    """Turn the reST markup used in docstrings (roles, double backticks) into Markdown."""
    text = _ROLE_WITH_TITLE.sub(r"`\1`", text)
    text = _SHORT_ROLE.sub(r"`\1`", text)
    text = _ROLE.sub(r"`\1`", text)
    return _DOUBLE_TICKS.sub(r"`\1`", text)


def format_annotation(annotation: Any) -> str:
    """A readable type: ``str | None``, ``list[str]``, ``'strict' | 'off'``."""
    if annotation is None or annotation is type(None):
        return "None"
    if annotation is Ellipsis:
        return "..."
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in args)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(format_annotation(arg) for arg in args)
    if origin is typing.Annotated:
        return format_annotation(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(format_annotation(arg) for arg in args)}]" if args else name
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


_COMPUTED = object()


def _default_value(field: Any) -> Any:
    if field.default_factory is None:
        return field.default
    try:
        return field.default_factory()
    except TypeError:  # a factory that needs the values of the other fields
        return _COMPUTED


def format_default(field: Any) -> str:
    """The default of a pydantic field as Markdown; *required* when there is none.

    A mapping whose text would be longer than ``MAX_DEFAULT_CHARS`` is summarised as its
    number of entries and its keys, so that one table cell does not hold a page of text.
    """
    if field.is_required():
        return "*required*"
    value = _default_value(field)
    if value is _COMPUTED:
        return "*computed from the other fields*"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, BaseModel):
        return f"`{type(value).__name__}(...)`"
    text = repr(value)
    if isinstance(value, Mapping) and len(text) > MAX_DEFAULT_CHARS:
        keys = ", ".join(f"`{key}`" for key in value)
        return f"{len(value)} entries: {keys}"
    return f"`{text}`"


def escape_cell(text: str) -> str:
    """Make ``text`` safe for one Markdown table cell (pipes outside code spans escaped)."""
    parts = " ".join(text.split()).split("`")
    for index in range(0, len(parts), 2):  # even parts lie outside code spans
        parts[index] = parts[index].replace("|", "\\|")
    return "`".join(parts)


def _slug(name: str) -> str:
    """The anchor MkDocs' table of contents gives a heading that is one class name."""
    return name.lower()


def _kind(cls: type) -> str:
    try:
        from dagster import Config, ConfigurableResource
    except ImportError:  # pragma: no cover - dagster is a dependency of the library
        return "pydantic model"
    if issubclass(cls, ConfigurableResource):
        return "Dagster resource (`ConfigurableResource`)"
    if issubclass(cls, Config):
        return "Dagster config (`Config`)"
    return "pydantic model"


def _type_cell(annotation: Any, documented: Iterable[str], owner: str) -> str:
    """The type as code, plus links to other documented classes it names."""
    shown = format_annotation(annotation)
    cell = f"`{shown}`"
    words = set(re.findall(r"[A-Za-z_]\w*", shown)) - {owner}
    links = [f"[{name}](#{_slug(name)})" for name in documented if name in words]
    return cell + (" (see " + ", ".join(links) + ")" if links else "")


def render_class(path: str, cls: type, documented: Iterable[str]) -> str:
    """One section: heading, import path, kind, docstring and the field table."""
    name = cls.__name__
    doc = cls.__dict__.get("__doc__")
    if not doc or not doc.strip():
        raise _fail(f"{path} has no docstring; the reference shows it as the class summary")
    module, _, _ = path.rpartition(".")
    lines = [
        f"## {name}",
        "",
        f"`from {module} import {name}` — {_kind(cls)}",
        "",
        rst_to_markdown(inspect.cleandoc(doc)),
        "",
        "| Field | Type | Default | Description |",
        "| --- | --- | --- | --- |",
    ]
    fields = cls.model_fields  # type: ignore[attr-defined]
    if not fields:
        raise _fail(f"{path} has no fields to document")
    for field_name, field in fields.items():
        if not field.description:
            raise _fail(
                f"{path}.{field_name} has no description; "
                "give it Field(description=...) so the reference can explain it"
            )
        row = (
            f"`{field_name}`",
            _type_cell(field.annotation, documented, name),
            format_default(field),
            escape_cell(rst_to_markdown(field.description)),
        )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def render_reference(paths: Iterable[str] = REFERENCE_CLASSES) -> str:
    """The whole generated part of the page: a list of classes, then one section each."""
    loaded = [(path, load_class(path)) for path in paths]
    names = [cls.__name__ for _, cls in loaded]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise _fail(f"class names must be unique on the page: {', '.join(duplicates)}")
    summary = [f"- [{cls.__name__}](#{_slug(cls.__name__)})" for _, cls in loaded]
    sections = [render_class(path, cls, names) for path, cls in loaded]
    return "\n".join(summary) + "\n\n" + "\n".join(sections)


# -- MkDocs events ---------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """Fail early when the page that receives the reference is missing."""
    if files.get_file_from_path(REFERENCE_PAGE) is None:
        raise _fail(f"the page {REFERENCE_PAGE} (holding {MARKER}) is missing from docs_dir")
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker of the reference page with the generated sections."""
    if page.file.src_uri != REFERENCE_PAGE:
        return markdown
    if markdown.count(MARKER) != 1:
        raise _fail(f"{REFERENCE_PAGE} must contain the line {MARKER} exactly once")
    return markdown.replace(MARKER, render_reference(REFERENCE_CLASSES))
