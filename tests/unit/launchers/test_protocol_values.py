"""The values Python and the cluster-side scripts share (``dagster_slurm.protocol``) reach
the scripts through the renderer only.

Every template of the package is rendered here through the library's own render functions
(the included snippets with the templates that include them). With the protocol values
swapped for stand-ins, each rendered script carries the stand-in of every protocol
placeholder it uses, so a change to ``protocol.py`` reaches bash. And the text of every
template file is checked for the values spelled out in code, one rule per value (see
:data:`RULES`); a failure names file, line, rule and the line itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import pytest

from dagster_slurm import protocol
from dagster_slurm.launchers import BashLauncher, ExecutionPlan
from dagster_slurm.launchers import script as script_module
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.launchers.script import (
    TEMPLATE_DIR,
    TEMPLATE_PACKAGE,
    ScriptTemplate,
    expand_includes,
    read_template_source,
    render_template,
    template_names,
)
from dagster_slurm.launchers.spark import SparkLauncher
from dagster_slurm.session.core.paths import SessionPaths
from dagster_slurm.session.core.step_server import render_server
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig
from dagster_slurm.session.head.standby import render_standby
from dagster_slurm.session.workers.job_script import render_worker

PATHS = SessionPaths.create("/base", "run1")
PLAN = ExecutionPlan(payload=("true",), job_dir="/j", status_file="/j/s", drain_file="/j/d",
                     mode="slurm", heartbeat_file="/j/hb", heartbeat_timeout=60)
WORKER = SlurmWorkerAllocationConfig(partition="gpu", num_nodes=2, gpus_per_node=1,
                                     time_limit="01:00:00", signal_before_timeout="TERM@120")

#: The library's render functions, together rendering every template of the package.
RENDERERS: dict[str, Callable[[], str]] = {
    "bash": lambda: BashLauncher().render(PLAN),
    "ray": lambda: RayLauncher().render(PLAN),
    "spark": lambda: SparkLauncher().render(PLAN),
    "step server": lambda: render_server(PATHS, "tok", "TERM", 60),
    "standby": lambda: render_standby(PATHS, "tok", "TERM", 60),
    "worker": lambda: render_worker(paths=PATHS, launcher=RayLauncher(), config=WORKER,
                                    activation=None, token="tok"),
}

#: Stand-ins for the protocol values: none of them occurs in a template by chance.
STAND_INS = {
    "protocol_submit_grace_seconds": "8150",
    "protocol_failed_record_seconds": "8060",
    "protocol_drain_grace_seconds": "8030",
    "protocol_walltime_margin_seconds": "8015",
    "protocol_removal_signal": "USR2",
    "protocol_worker_draining": "stand-in-draining",
    "protocol_worker_released": "stand-in-released",
    "protocol_requeued_status": "8118",
    "protocol_requeue_refusal": "stand-in refusal words",
}


def _package_templates() -> set[str]:
    folder = resources.files(TEMPLATE_PACKAGE).joinpath(TEMPLATE_DIR)
    return {entry.name for entry in folder.iterdir() if entry.name.endswith(".sh")}


def _render_all(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, str], set[str]]:
    """Every renderer's script, and the templates ``render_template`` loaded for them."""
    loaded: set[str] = set()
    load = script_module.load_template

    def recording(name: str) -> ScriptTemplate:
        loaded.add(name)
        return load(name)

    monkeypatch.setattr(script_module, "load_template", recording)
    return {what: render() for what, render in RENDERERS.items()}, loaded


def _with_includes(names: set[str]) -> set[str]:
    read: set[str] = set()

    def reader(name: str) -> str:
        read.add(name)
        return read_template_source(name)

    for name in names:
        expand_includes(name, reader)
    return read


def test_every_template_of_the_package_is_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    _, loaded = _render_all(monkeypatch)
    missing = _package_templates() - _with_includes(loaded)
    assert not missing, (f"templates {sorted(missing)} are not rendered by any of RENDERERS; "
                         "add the function that renders them")


def test_every_protocol_constant_is_a_template_value() -> None:
    constants = {name: value for name, value in vars(protocol).items()
                 if name.isupper() and not name.startswith("TEMPLATE_")}
    expected = {}
    for name, value in constants.items():
        expected[f"protocol_{name.lower()}"] = (
            value if isinstance(value, str) else str(int(value)))
    assert dict(protocol.TEMPLATE_VALUES) == expected
    assert set(STAND_INS) == set(expected)
    assert {rule.value for rule in RULES} == set(constants)


def test_the_rendered_scripts_carry_the_protocol_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script_module, "TEMPLATE_VALUES", STAND_INS)
    rendered, loaded = _render_all(monkeypatch)
    used = {name: {key for key in template_names(ScriptTemplate(expand_includes(name)))
                   if key.startswith(protocol.TEMPLATE_PREFIX)} for name in loaded}
    assert used["ray_worker.sh"] == set(STAND_INS) - {
        "protocol_submit_grace_seconds", "protocol_failed_record_seconds",
        "protocol_drain_grace_seconds", "protocol_requeued_status", "protocol_requeue_refusal"}
    for launcher in ("bash", "ray", "spark", "worker"):
        assert "\n__ds_requeued_status=8118\n" in rendered[launcher], launcher
        assert "\n__ds_requeue_refusal='stand-in refusal words'\n" in rendered[launcher]
    texts = "\n".join(rendered.values())
    for name, keys in used.items():
        for key in keys:
            assert script_module.shell_word(STAND_INS[key]) in texts, (name, key)
    worker = rendered["worker"]
    for line in ("__dw_removal_signal=USR2", "__dw_walltime_margin=8015",
                 "__dw_state_draining=stand-in-draining",
                 "__dw_state_released=stand-in-released"):
        assert f"\n{line}\n" in worker


def test_the_worker_script_gets_the_values_of_protocol_py() -> None:
    text = RENDERERS["worker"]()
    assert f"\n__dw_removal_signal={protocol.REMOVAL_SIGNAL}\n" in text
    assert f"\n__dw_walltime_margin={int(protocol.WALLTIME_MARGIN_SECONDS)}\n" in text
    assert f"\n__dw_state_draining={protocol.WORKER_DRAINING}\n" in text
    assert f"\n__dw_state_released={protocol.WORKER_RELEASED}\n" in text
    # The prologue drains on the same signal (its drain signal comes from Python).
    assert f"\n__ds_drain_signal={protocol.REMOVAL_SIGNAL}\n" in text


# -- hard-coded values ----------------------------------------------------------------------

_TEST_OPERATOR = r"-(?:lt|le|gt|ge|eq|ne)"


def _operand(number: str) -> str:
    """``number`` as an operand of arithmetic (``+ - * / % < > ? :``) or of a test
    (``-lt`` ...), not as part of another number or word (``tail -n 15`` is no operand)."""
    n = re.escape(number)
    return (rf"(?:(?:[-+*/%<>?:]=?|==|{_TEST_OPERATOR})\s*{n}(?![\w.])"
            rf"|(?<![\w.$]){n}\s*(?:[-+*/%<>?:]|{_TEST_OPERATOR}\b))")


def _seconds(value: float) -> str:
    return str(int(value))


def _state_word(word: str) -> str:
    """``word`` used as a state value: written (``*write_state word``), compared or assigned
    (``= word``, ``!= "word"``), or a case label (``word)``, ``"word "*)``); not in a
    sentence of a log message."""
    w = re.escape(word)
    end = r"""(?=["'\s*);\]|]|$)"""
    return (rf"write_state\s+[\"']?{w}{end}"
            rf"|(?:!=|==|=)\s*[\"']?{w}{end}"
            rf"|(?:^|\|)\s*\(?[\"']?{w}(?:\s*[\"'])?\*?\s*[|)]")


@dataclass(frozen=True)
class Rule:
    """The protocol constant ``value`` spelled out where a template means it: ``pattern``
    found in a code line that also matches ``context`` (any code line when None)."""

    value: str
    meaning: str
    pattern: str
    context: str | None = None

    def matches(self, code: str) -> bool:
        if self.context is not None and re.search(self.context, code) is None:
            return False
        return re.search(self.pattern, code) is not None


#: One rule per constant of ``protocol.py``, built from its current value.
RULES: tuple[Rule, ...] = (
    Rule("REMOVAL_SIGNAL", "the removal signal's name",
         rf"(?<!\w)(?:SIG)?{re.escape(protocol.REMOVAL_SIGNAL)}(?!\w)"),
    Rule("WORKER_DRAINING", "the draining state word as a state value",
         _state_word(protocol.WORKER_DRAINING)),
    Rule("WORKER_RELEASED", "the released state word as a state value",
         _state_word(protocol.WORKER_RELEASED)),
    Rule("WALLTIME_MARGIN_SECONDS", "the walltime margin computed with a walltime or lead",
         rf"{_operand(_seconds(protocol.WALLTIME_MARGIN_SECONDS))}"
         rf"|\b{_seconds(protocol.WALLTIME_MARGIN_SECONDS)} s\b",
         r"(?i)walltime|lead|margin"),
    Rule("DRAIN_GRACE_SECONDS", "the drain grace computed with a deadline or grace",
         _operand(_seconds(protocol.DRAIN_GRACE_SECONDS)), r"(?i)deadline|grace"),
    Rule("SUBMIT_GRACE_SECONDS", "the submission grace, a number no template has otherwise",
         rf"(?<![\w.]){_seconds(protocol.SUBMIT_GRACE_SECONDS)}(?![\w.])"),
    Rule("FAILED_RECORD_SECONDS", "the failed record's age computed with a record",
         _operand(_seconds(protocol.FAILED_RECORD_SECONDS)), r"(?i)record|failed"),
    Rule("REQUEUED_STATUS", "the requeued exit status, a number no template has otherwise",
         rf"(?<![\w.]){protocol.REQUEUED_STATUS}(?![\w.])"),
    Rule("REQUEUE_REFUSAL", "the refusal's words", re.escape(protocol.REQUEUE_REFUSAL)),
)

_TRAILING_COMMENT = re.compile(r"(?:^|\s)#.*$")


def code_of(line: str) -> str:
    """``line`` without its comment: a line starting with ``#``, or `` #...`` after code
    (``$#`` and ``${#x}`` stay; a `` #`` inside a quoted string cuts the line there)."""
    return _TRAILING_COMMENT.sub("", line)


def hard_coded(name: str, source: str) -> list[str]:
    """``<file>:<line>: <rule>: <line>`` for every code line of ``source`` a rule matches."""
    found = []
    for number, line in enumerate(source.splitlines(), start=1):
        code = code_of(line)
        for rule in RULES:
            if code.strip() and rule.matches(code):
                found.append(f"{name}:{number}: {rule.value} ({rule.meaning}): {line.strip()}")
    return found


def test_no_template_hard_codes_a_protocol_value() -> None:
    found = [hit for name in sorted(_package_templates())
             for hit in hard_coded(name, read_template_source(name))]
    assert not found, ("templates spell values of dagster_slurm/protocol.py; use a "
                       "@@{protocol_<name>} placeholder (through a variable) instead:\n"
                       + "\n".join(found))


@pytest.mark.parametrize("line", [
    'if [ "$1" = USR1 ] || [ "$1" = "$__dw_walltime_signal" ]; then',
    "for __dw_sig in TERM INT HUP USR1 $__dw_walltime_signal; do",
    "kill -USR1 \"$pid\"",
    "trap __x SIGUSR1",
    "    __dw_write_state draining",
    '    __dw_write_state "released $1"',
    '[ "$state" != "draining" ] || return 0',
    '        "released "*) return 0 ;;',
    "        printf '%s\\n' $(( now + (__dw_drain_lead > 15 ? __dw_drain_lead - 15 : 0) ))",
    '__dw_log "the drain ends 15 s before the walltime"',
    "[ \"$now\" -gt $((deadline + 30)) ] && scancel \"$job\"",
    "grace=150",
    '[ $((now - failed_at)) -lt 60 ] || rm -f "$record"',
], ids=lambda line: line.strip()[:40])
def test_the_rules_find_a_hard_coded_value(line: str) -> None:
    assert hard_coded("t.sh", line), line


@pytest.mark.parametrize("line", [
    "# drain: written by the session before it sends USR1 (15 s before the walltime)",
    'tail -n 15 "$log"',
    '__dw_log "node ${__dw_hosts[i]} (Ray node ${__dw_ids[i]}) is draining"',
    '__dw_log "draining: node(s)$left still busy; $((__dw_deadline - now)) s to the deadline"',
    '    "released after $__dw_rejoin_timeout s without one)"',
    '__dw_host_report "draining term=$__dw_host_term"',
    "deadline=$((SECONDS + 5))",
    'if [ $((SECONDS - reported)) -ge 30 ]; then',
    '[ "$*" = "$__dw_said" ] && [ $((SECONDS - __dw_said_at)) -lt 60 ]',
    "timeout 60 ray drain-node --deadline-remaining-seconds \"$left\"",
    'for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do',
    "__dw_write_state \"$__dw_state_released $1\"",
], ids=lambda line: line.strip()[:40])
def test_the_rules_leave_other_uses_alone(line: str) -> None:
    assert not hard_coded("t.sh", line), line


# -- the renderer ---------------------------------------------------------------------------

def _fake(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(script_module, "load_template", lambda name: ScriptTemplate(text))


def test_protocol_placeholders_are_filled_where_used(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, "a=@@{x}\nsig=@@{protocol_removal_signal}\n")
    assert render_template("fake.sh", {"x": "1"}) == (
        f"a=1\nsig={protocol.REMOVAL_SIGNAL}\n")


def test_a_caller_cannot_pass_a_protocol_value(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, "sig=@@{protocol_removal_signal}\n")
    with pytest.raises(ValueError, match="come from dagster_slurm.protocol"):
        render_template("fake.sh", {"protocol_removal_signal": "TERM"})


def test_an_unknown_protocol_placeholder_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, "x=@@{protocol_no_such_value}\n")
    with pytest.raises(KeyError, match="protocol_no_such_value"):
        render_template("fake.sh", {})
