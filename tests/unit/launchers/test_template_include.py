"""Templates that include other templates (``@@include <name>.sh``), and the one heartbeat
clock the dead-man's switches share through it."""

from __future__ import annotations

import re

import pytest

from dagster_slurm.launchers import BashLauncher, ExecutionPlan
from dagster_slurm.launchers.script import (
    ScriptTemplate,
    expand_includes,
    load_template,
    read_template_source,
)
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.step_server import render_server
from dagster_slurm.session.head.standby import render_standby

CLOCK = "heartbeat_clock.sh"
#: The scripts with a dead-man's switch; each must get its clock from the included template.
SWITCHES = ("job_common.sh", "session_server.sh", "successor_standby.sh")


def _reader(files: dict[str, str]):  # noqa: ANN202
    return lambda name: files[name]


def test_an_include_line_is_replaced_by_the_included_text() -> None:
    files = {"a.sh": "#!/bin/bash\n@@include b.sh\necho after\n", "b.sh": "echo b\necho b2\n"}
    assert expand_includes("a.sh", _reader(files)) == "#!/bin/bash\necho b\necho b2\necho after\n"


def test_includes_nest_and_only_whole_lines_count() -> None:
    files = {
        "a.sh": "@@include b.sh\necho '@@include c.sh' stays\n",
        "b.sh": "@@include c.sh\necho b\n",
        "c.sh": "echo c\n",
    }
    assert expand_includes("a.sh", _reader(files)) == (
        "echo c\necho b\necho '@@include c.sh' stays\n"
    )


def test_placeholders_of_included_text_follow_the_quoting_rules() -> None:
    files = {"a.sh": "@@include b.sh\n", "b.sh": "x=@@{value}\n"}
    template = ScriptTemplate(expand_includes("a.sh", _reader(files)))
    assert template.substitute(value="'$(reboot)'") == "x='$(reboot)'\n"


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"a.sh": "@@include a.sh\n"}, "include cycle (a.sh -> a.sh)"),
        ({"a.sh": "@@include b.sh\n", "b.sh": "@@include a.sh\n"},
         "include cycle (a.sh -> b.sh -> a.sh)"),
        ({"a.sh": "@@include ../etc/passwd\n"}, "no path"),
        ({"a.sh": "@@include\n"}, "must name a template"),
    ],
)
def test_a_cycle_or_a_path_is_refused_naming_the_template(files: dict[str, str],
                                                           words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)) as info:
        expand_includes("a.sh", _reader(files))
    assert str(info.value).startswith("a.sh: ") or str(info.value).startswith("b.sh: ")


def test_every_rendered_switch_carries_the_clock_once() -> None:
    paths = SessionPaths.create("/base", "run1")
    plan = ExecutionPlan(payload=("true",), job_dir="/j", status_file="/j/s", drain_file="/j/d",
                         mode="slurm", heartbeat_file="/j/hb", heartbeat_timeout=60)
    rendered = {
        "job_common.sh": BashLauncher().render(plan),
        "session_server.sh": render_server(paths, "tok", "USR1", 60),
        "successor_standby.sh": render_standby(paths, "tok", "USR1", 60),
    }
    assert set(rendered) == set(SWITCHES)
    for name, text in rendered.items():
        assert "@@include" not in text, name
        assert text.count("__hb_stale() {") == 1, name
        assert text.count("__hb_clock() {") == 1, name
    assert "@@include" not in load_template("job_common.sh").template


def test_the_clock_is_written_once_in_the_package() -> None:
    # No switch keeps a copy of its own: /proc/uptime is read in the included clock only.
    assert "/proc/uptime" in read_template_source(CLOCK)
    for name in SWITCHES:
        source = read_template_source(name)
        assert "/proc/uptime" not in source, name
        assert "@@include heartbeat_clock.sh" in source or "@@{prologue}" in source, name
