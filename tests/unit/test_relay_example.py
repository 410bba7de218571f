"""The relay example (examples/dagster_slurm_relay): its definitions load, it runs in local
mode, its policy's pure parts, and docs/relay.md quotes its code as it is.

Its behaviour on Slurm (drain, successor, promotion) is tested on the dev cluster:
tests/integration/test_relay_request_drain.py and test_relay_example_walltime.py.
"""

import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from dagster_slurm_relay import defs  # noqa: E402
from dagster_slurm_relay.definitions import relayed_units  # noqa: E402
from dagster_slurm_relay.relay import RelayPolicy, Watch, completion_report  # noqa: E402

from dagster_slurm import ComputeResource, JobState  # noqa: E402


def test_the_definitions_load() -> None:
    dg.Definitions.validate_loadable(defs)
    assert defs.resolve_assets_def("relayed_units").key == dg.AssetKey("relayed_units")


def test_local_mode_commits_every_unit_in_one_payload_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DAGSTER_SLURM_LOCAL_BASE", str(tmp_path / "runs"))
    work = tmp_path / "units"
    config = {"work_dir": str(work), "units": 6, "unit_seconds": 0.01}
    result = dg.materialize([relayed_units], resources={"compute": ComputeResource(mode="local")},
                            run_config={"ops": {"relayed_units": {"config": config}}})
    assert result.success
    (materialization,) = result.asset_materializations_for_node("relayed_units")
    (entry,) = materialization.metadata["rounds"].value
    assert entry["units"] == list(range(6)) and entry["remaining"] == 0
    assert not entry["drained"] and not entry["duplicates"]
    commits = sorted(p.name for p in work.iterdir() if p.name.startswith("unit-"))
    assert commits == [f"unit-{u:05d}.json" for u in range(6)]
    assert json.loads((work / "unit-00003.json").read_text())["unit"] == 3
    assert not list(work.glob("*.partial"))
    assert not list((tmp_path / "runs").rglob("relayed_units")), "deferred files are removed"


def test_a_second_run_skips_committed_units(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DAGSTER_SLURM_LOCAL_BASE", str(tmp_path / "runs"))
    config = {"work_dir": str(tmp_path / "units"), "units": 4, "unit_seconds": 0.01}
    run = {"ops": {"relayed_units": {"config": config}}}
    resources = {"compute": ComputeResource(mode="local")}
    assert dg.materialize([relayed_units], resources=resources, run_config=run).success
    again = dg.materialize([relayed_units], resources=resources, run_config=run)
    (materialization,) = again.asset_materializations_for_node("relayed_units")
    (entry,) = materialization.metadata["rounds"].value
    assert entry["units"] == [] and entry["remaining"] == 0


def test_seconds_left_reads_end_time_in_the_cluster_timezone() -> None:
    now = datetime(2026, 11, 30, 13, 0, 0, tzinfo=timezone.utc)
    berlin = RelayPolicy(cluster_timezone="Europe/Berlin")  # UTC+1 in November
    assert berlin.seconds_left("2026-11-30T14:10:00", now) == 600.0
    assert RelayPolicy(cluster_timezone="UTC").seconds_left("2026-11-30T13:00:30", now) == 30.0
    assert berlin.seconds_left(None, now) is None
    assert berlin.seconds_left("", now) is None


def test_the_successor_inherits_what_the_policy_leaves_unset() -> None:
    assert RelayPolicy().successor_config().model_fields_set == set()
    config = RelayPolicy(successor_time_limit="12:00:00").successor_config()
    assert config.model_fields_set == {"time_limit"} and config.time_limit == "12:00:00"


def test_completion_report_is_the_last_remaining_report() -> None:
    assert completion_report([]) is None  # a prelaunch drain: exit 0, nothing reported
    assert completion_report([{"unit": 1}, "text"]) is None
    reports = [{"remaining": 5}, {"unit": 2}, {"remaining": 0, "processed": 1}]
    assert completion_report(reports) == {"remaining": 0, "processed": 1}


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, text: str) -> None:
        self.lines.append(text)

    warning = info


class _Successor:
    """A successor whose scheduler states are given in order (the last one repeats)."""

    def __init__(self, *states: JobState | None) -> None:
        self.job_id, self.states = "102", list(states)

    def state(self) -> JobState | None:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


class _Cluster:
    """The session, allocation and scheduler calls the policy makes, recorded."""

    def query_end_time(self) -> str | None:
        return self.end

    def __init__(self, end_time: str | None, successor: _Successor | None = None) -> None:
        self.job_id, self.end, self.drain_signal = "101", end_time, "TERM"
        self.calls: list[str] = []
        self.successor = successor or _Successor(JobState.PENDING)
        self.scheduler = self

    def submit_successor(self, config, logger=None):  # noqa: ANN001, ANN201
        self.calls.append(f"submit {config.time_limit}")
        return self.successor

    def request_drain(self) -> None:
        self.calls.append("drain")

    def cancel(self, job_ids) -> None:  # noqa: ANN001
        self.calls.append(f"cancel {','.join(job_ids)}")

    def promote_successor(self, logger=None):  # noqa: ANN001, ANN201
        self.calls.append("promote")
        return "promoted"


def _in(seconds: float) -> str:
    return datetime.fromtimestamp(datetime.now().timestamp() + seconds).isoformat(timespec="seconds")


def test_the_watch_queues_the_successor_then_drains_when_the_end_comes_near() -> None:
    policy = RelayPolicy(successor_lead=600, drain_lead=120, successor_time_limit="01:00:00")
    far = _Cluster(_in(3600))
    Watch(far, far, policy, None, _Log()).check()
    assert far.calls == []  # an hour left: nothing yet
    near = _Cluster(_in(300))
    watch = Watch(near, near, policy, None, _Log())
    watch.check()
    assert near.calls == ["submit 01:00:00"] and watch.successor is near.successor
    near.end = _in(60)
    watch.check()
    watch.check()
    assert near.calls == ["submit 01:00:00", "drain"]  # once: a drain is final
    assert watch.drain_requested_with is JobState.PENDING


def test_the_watch_decides_nothing_without_an_end_time() -> None:
    cluster = _Cluster(None)
    Watch(cluster, cluster, RelayPolicy(successor_lead=1e9, drain_lead=1e9), None, _Log()).check()
    assert cluster.calls == []


QUOTE = re.compile(r"<!-- quoted from (?P<path>\S+) -->\n```python\n(?P<code>.*?)\n```", re.S)


def test_docs_relay_page_quotes_the_example_as_it_is() -> None:
    page = (ROOT / "docs" / "relay.md").read_text(encoding="utf-8")
    quotes = list(QUOTE.finditer(page))
    assert len(quotes) >= 5, "docs/relay.md quotes the example's code"
    for quote in quotes:
        source = (ROOT / quote["path"]).read_text(encoding="utf-8")
        assert quote["code"] in source, (
            f"docs/relay.md quotes {quote['path']} in a form the file no longer has:\n"
            f"{quote['code'][:400]}")


@pytest.mark.parametrize("name", ["relay.md"])
def test_the_relay_page_is_linked(name: str) -> None:
    for page, link in (("index.md", f"]({name}"), ("sessions/successors.md", f"](../{name}")):
        assert link in (ROOT / "docs" / page).read_text(encoding="utf-8"), page
    assert f"docs/{name}" in (ROOT / "README.md").read_text(encoding="utf-8")
