"""Start estimates of candidate worker allocations: their rendering (the options
add_worker_allocation submits), the estimator's limits, cache and round trips (in-memory
cluster with scripted sbatch --test-only answers), and the agent's half (the real agent
program with a stub sbatch on PATH)."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from session_fakes import FakeCluster, on_fake_cluster

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.errors import ConfigurationError
from dagster_slurm.launchers.bash import BashLauncher
from dagster_slurm.launchers.ray import RayLauncher
from dagster_slurm.resources.slurm import SlurmResource
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.scheduler.client import SlurmScheduler
from dagster_slurm.session.core.config import SlurmRunAllocationConfig
from dagster_slurm.session.core.errors import SessionError
from dagster_slurm.session.core.io import AgentSessionIO, StartProbe
from dagster_slurm.session.core.worker_config import SlurmWorkerAllocationConfig as Worker
from dagster_slurm.session.scaling.estimates import (
    SbatchTestOnlyEstimator,
    WorkerStartEstimate,
    default_estimator,
)
from dagster_slurm.session.session import RunSession
from dagster_slurm.session.workers.job_script import worker_submission
from dagster_slurm.slurm.commands import SbatchSpec, sbatch_argv
from dagster_slurm.slurm.queue import SlurmQueueConfig
from dagster_slurm.slurm.test_only import TEST_ONLY_SCRIPT, TestOnlyResult, parse_test_only
from dagster_slurm.transport.local import LocalTransport

QUEUE = SlurmQueueConfig(partition="cpu", num_nodes=1, mem="8G", account="proj-a", qos="high",
                         reservation="maint")
HEAD = SlurmRunAllocationConfig(time_limit="01:00:00", cpus_per_task=4)


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _option(options: Sequence[str], name: str) -> str | None:
    prefix = f"--{name}="
    return next((o[len(prefix):] for o in options if o.startswith(prefix)), None)


@dataclass
class ProbingCluster(FakeCluster):
    """The in-memory cluster, answering ``probe_starts`` with ``answer(spec)``: by default a
    start ``delays[partition]`` seconds after the login node's clock; ``probes`` keeps the
    specs of each round trip."""

    delays: dict[str, float] = field(default_factory=lambda: {"cpu": 0.0, "gpu": 1800.0})
    answer: Callable[[SbatchSpec], TestOnlyResult] | None = None
    probes: list[list[SbatchSpec]] = field(default_factory=list)

    def _answer(self, spec: SbatchSpec) -> TestOnlyResult:
        if self.answer is not None:
            return self.answer(spec)
        partition = spec.partition or "cpu"
        if partition not in self.delays:
            return parse_test_only("sbatch: error: invalid partition specified: "
                                   f"{partition}\nallocation failure: Invalid partition name "
                                   "specified\n", 1)
        start = _utc(self.clock.wall() + self.delays[partition])
        return parse_test_only(f"sbatch: Job 9 to start at {start} using 1 processors on nodes "
                               f"{partition[0]}1 in partition {partition}\n", 0)

    def probe_starts(self, specs: Sequence[SbatchSpec], *, with_document: bool) -> StartProbe:
        self._count("probe_starts")
        self.probes.append(list(specs))
        document = self.read() if with_document else None
        return StartProbe(tuple(self._answer(spec) for spec in specs), document, self.clock.wall())


def _session(launcher: Any = None, queue: SlurmQueueConfig = QUEUE
             ) -> tuple[RunSession, ProbingCluster]:
    slurm = SlurmResource(ssh=SSHConnectionResource(host="login.invalid", user="u"),
                          remote_base="/cluster/ds", queue=queue)
    session, cluster = on_fake_cluster(slurm, str(uuid.uuid4()), HEAD, launcher or RayLauncher(),
                                       activation="/env/activate.sh",
                                       cluster_class=ProbingCluster)
    assert isinstance(cluster, ProbingCluster)
    return session, cluster


def _submitted_options(cluster: ProbingCluster) -> list[str]:
    """The options of the last submission, as sbatch got them (without the script path;
    the scheduler adds the token's --comment)."""
    return sbatch_argv(cluster.specs[-1], script_on_stdin=True)[1:]


def _estimator(cluster: ProbingCluster, **kwargs: Any) -> SbatchTestOnlyEstimator:
    return SbatchTestOnlyEstimator(clock=cluster.clock.monotonic, **kwargs)


# -- rendering -----------------------------------------------------------------------------------
def test_options_are_what_add_worker_allocation_submits_inheriting_from_the_head():
    session, cluster = _session()
    candidate = Worker(partition="gpu", gpus_per_node=2)
    (options,) = session.worker_sbatch_options([candidate])
    session.add_worker_allocation(candidate)
    assert options == _submitted_options(cluster)
    assert (_option(options, "account"), _option(options, "qos"), _option(options, "reservation"),
            _option(options, "mem"), _option(options, "time")) == (
        "proj-a", "high", "maint", "8G", "01:00:00")
    assert not any(o.startswith("--comment") for o in options)
    assert cluster.calls.get("probe_starts") is None, "rendering asks the scheduler nothing"


def test_after_a_first_worker_candidates_inherit_from_it_like_submissions_do():
    session, cluster = _session()
    session.add_worker_allocation(Worker(partition="gpu", gpus_per_node=2, time_limit="00:30:00",
                                         mem_per_cpu="2G", nodelist="g1"))
    candidates = [Worker(), Worker(mem="16G", time_limit="02:00:00")]
    rendered = session.worker_sbatch_options(candidates)
    for candidate, options in zip(candidates, rendered, strict=True):
        session.add_worker_allocation(candidate)
        assert options == _submitted_options(cluster)
    assert _option(rendered[0], "time") == "00:30:00" and _option(rendered[0], "mem-per-cpu") == "2G"
    assert _option(rendered[0], "nodelist") is None, "nodelist is per submission"
    assert _option(rendered[1], "mem") == "16G" and _option(rendered[1], "mem-per-cpu") is None


def test_the_worker_script_has_no_sbatch_directives_so_the_probe_script_is_equivalent():
    session, _ = _session()
    _spec, files = worker_submission(paths=session.paths, job_name=session.job_name,
                                     launcher=RayLauncher(), config=Worker(
                                         partition="gpu", num_nodes=1, cpus_per_task=2,
                                         gpus_per_node=1, time_limit="00:10:00"),
                                     activation="/env/activate.sh", token="tok")
    (text, _mode), = files.values()
    assert "#SBATCH" not in text and "#SBATCH" not in TEST_ONLY_SCRIPT


def test_a_session_without_ray_or_closed_has_no_worker_estimates():
    session, _ = _session(BashLauncher())
    with pytest.raises(SessionError, match="RayLauncher"):
        session.worker_sbatch_options([Worker()])
    with pytest.raises(SessionError, match="RayLauncher"):
        session.estimate_worker_starts([Worker()], _estimator(_session()[1]))
    session, cluster = _session()
    session.close(cancel=False)
    with pytest.raises(SessionError, match="closed"):
        session.estimate_worker_starts([Worker()], _estimator(cluster))


@pytest.mark.parametrize(("candidates", "field_name"), [
    (Worker(), "candidates"), ("gpu", "candidates"), ([Worker(), {"partition": "gpu"}], "candidates[1]"),
])
def test_candidates_must_be_a_list_of_worker_configs(candidates: Any, field_name: str):
    session, cluster = _session()
    with pytest.raises(ConfigurationError) as raised:
        session.estimate_worker_starts(candidates, _estimator(cluster))
    assert raised.value.field == field_name


# -- the estimator -------------------------------------------------------------------------------
def test_estimates_count_from_the_login_clock_with_the_walltime_and_errors():
    session, cluster = _session()
    candidates = [Worker(partition="cpu"), Worker(partition="gpu", time_limit="02:00:00"),
                  Worker(partition="nosuch")]
    now, later, rejected = session.estimate_worker_starts(candidates, _estimator(cluster))
    assert (now.start_in_seconds, now.time_limit_seconds, now.error) == (0.0, 3600.0, None)
    assert now.partition == "cpu" and now.nodes == ("c1",) and now.config is candidates[0]
    assert later.start_in_seconds == pytest.approx(1800.0) and later.time_limit_seconds == 7200.0
    assert rejected.start_in_seconds is None and rejected.error == "Invalid partition name specified"
    assert rejected.time_limit_seconds == 3600.0, "the inherited walltime"
    assert now.starts_within(0) and not later.starts_within(1799) and later.starts_within(1800)
    assert not rejected.starts_within(10**9)
    assert [e.options for e in (now, later, rejected)] == [
        tuple(o) for o in session.worker_sbatch_options(candidates)]
    assert cluster.calls["probe_starts"] == 1 and len(cluster.probes[0]) == 3


def test_more_than_max_candidates_is_refused_before_anything_is_sent():
    session, cluster = _session()
    with pytest.raises(ConfigurationError, match="at most 2 per call") as raised:
        session.estimate_worker_starts([Worker(), Worker(), Worker()],
                                       _estimator(cluster, max_candidates=2))
    assert raised.value.field == "candidates"
    with pytest.raises(ConfigurationError, match="at most 8"):
        session.estimate_worker_starts([Worker()] * 9)
    assert cluster.calls == {}, "no read, no probe"
    assert session.estimate_worker_starts([], _estimator(cluster)) == []
    assert cluster.calls == {}


@pytest.mark.parametrize(("kwargs", "field_name"), [
    ({"max_candidates": 0}, "max_candidates"), ({"max_candidates": 2.5}, "max_candidates"),
    ({"max_candidates": True}, "max_candidates"), ({"cache_seconds": -1}, "cache_seconds"),
    ({"cache_seconds": float("inf")}, "cache_seconds"), ({"cache_seconds": "60"}, "cache_seconds"),
])
def test_estimator_limits_are_checked(kwargs: dict[str, Any], field_name: str):
    with pytest.raises(ConfigurationError) as raised:
        SbatchTestOnlyEstimator(**kwargs)
    assert raised.value.field == field_name


def test_answers_are_reused_for_cache_seconds_and_their_start_moves_closer():
    session, cluster = _session()
    estimator = _estimator(cluster, cache_seconds=60)
    gpu = [Worker(partition="gpu")]
    assert session.estimate_worker_starts(gpu, estimator)[0].start_in_seconds == pytest.approx(1800)
    cluster.clock.sleep(45)
    again = session.estimate_worker_starts(gpu, estimator)[0]
    assert again.start_in_seconds == pytest.approx(1755), "the same start, 45 s closer"
    # without a first worker allocation the document is read (it could have one by now)
    assert [len(specs) for specs in cluster.probes] == [1, 0]
    cluster.clock.sleep(16)
    assert session.estimate_worker_starts(gpu, estimator)[0].start_in_seconds == pytest.approx(1800)
    assert [len(specs) for specs in cluster.probes] == [1, 0, 1], "expired: asked again"


def test_a_known_first_worker_and_fresh_answers_cost_no_round_trip():
    session, cluster = _session()
    session.add_worker_allocation(Worker(partition="gpu", gpus_per_node=1))
    estimator = _estimator(cluster)
    candidates = [Worker(), Worker(partition="cpu", gpus_per_node=0)]
    first = session.estimate_worker_starts(candidates, estimator)
    calls = dict(cluster.calls)
    second = session.estimate_worker_starts(candidates, estimator)
    assert cluster.calls == calls, "nothing sent"
    assert [e.options for e in first] == [e.options for e in second]


def test_duplicate_candidates_cost_one_rpc_and_zero_cache_asks_every_time():
    session, cluster = _session()
    estimator = _estimator(cluster, cache_seconds=0)
    session.estimate_worker_starts([Worker(partition="gpu"), Worker(partition="gpu")], estimator)
    session.estimate_worker_starts([Worker(partition="gpu")], estimator)
    assert [len(specs) for specs in cluster.probes] == [1, 1]


def test_an_answer_without_a_verdict_is_not_reused():
    session, cluster = _session()
    cluster.answer = lambda spec: parse_test_only("", 0)
    estimator = _estimator(cluster)
    (estimate,) = session.estimate_worker_starts([Worker()], estimator)
    assert estimate.start_in_seconds is None and "no start estimate" in (estimate.error or "")
    cluster.answer = None
    (estimate,) = session.estimate_worker_starts([Worker()], estimator)
    assert estimate.start_in_seconds == 0.0
    assert [len(specs) for specs in cluster.probes] == [1, 1]


def test_a_first_worker_that_appeared_since_is_rendered_in_a_second_round_trip():
    session, cluster = _session()
    estimator = _estimator(cluster)
    session.estimate_worker_starts([Worker()], estimator)  # no worker yet: inherits the head
    session.add_worker_allocation(Worker(partition="gpu", time_limit="00:20:00"))
    (estimate,) = session.estimate_worker_starts([Worker()], estimator)
    assert estimate.options == tuple(session.worker_sbatch_options([Worker()])[0])
    assert estimate.time_limit_seconds == 1200.0 and estimate.partition == "gpu"
    # the head-inherited options were answered before: the read alone, then the new options
    assert [len(specs) for specs in cluster.probes] == [1, 0, 1]
    assert [spec.partition for spec in cluster.probes[-1]] == ["gpu"]
    session.estimate_worker_starts([Worker()], estimator)
    assert len(cluster.probes) == 3, "the first worker is known now: the answer is reused"


def test_a_candidate_that_only_holds_with_the_first_worker_is_rendered_from_the_document():
    session, cluster = _session(queue=QUEUE.model_copy(update={"time_limit": "01:00:00", "time_min": "00:50:00"}))
    session.add_worker_allocation(Worker(time_limit="00:20:00", time_min="00:10:00"))
    # inherited from the head (time_min 00:50:00) the candidate would not hold; the session
    # has a first worker allocation (time_min 00:10:00), which it inherits from instead
    candidate = Worker(time_limit="00:30:00")
    (estimate,) = session.estimate_worker_starts([candidate], _estimator(cluster))
    assert estimate.error is None and estimate.time_limit_seconds == 1800.0
    session.add_worker_allocation(candidate)
    assert list(estimate.options) == _submitted_options(cluster)
    assert cluster.calls["read"] >= 1 and len(cluster.probes) == 1


def test_a_candidate_that_holds_with_neither_is_refused_like_its_submission():
    session, cluster = _session()
    session.add_worker_allocation(Worker(time_limit="00:20:00", time_min="00:10:00"))
    with pytest.raises(ConfigurationError, match="time_min"):
        session.estimate_worker_starts([Worker(time_limit="00:05:00")], _estimator(cluster))
    with pytest.raises(ConfigurationError, match="time_min"):
        session.add_worker_allocation(Worker(time_limit="00:05:00"))


def test_a_custom_estimator_object_replaces_the_default():
    session, cluster = _session()
    seen: list[tuple[Any, list[Worker]]] = []

    class Calendar:
        def estimate(self, session: Any, candidates: Sequence[Worker]):
            seen.append((session, list(candidates)))
            return (WorkerStartEstimate(c, 600.0, 3600.0, None) for c in candidates)

    candidates = [Worker(partition="gpu")]
    estimates = session.estimate_worker_starts(candidates, Calendar())
    assert seen == [(session.context, candidates)] and isinstance(estimates, list)
    assert estimates[0].starts_within(600) and cluster.calls == {}
    with pytest.raises(ConfigurationError) as raised:
        session.estimate_worker_starts(candidates, object())  # type: ignore[arg-type]
    assert raised.value.field == "estimator"


def test_the_default_estimator_is_shared_and_has_the_documented_limits():
    assert default_estimator() is default_estimator()
    assert (default_estimator().max_candidates, default_estimator().cache_seconds) == (8, 60.0)


# -- the agent's half ----------------------------------------------------------------------------
class _LocalSlurm:
    """What AgentSessionIO needs of a SlurmResource: an agent client and its scheduler."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self._scheduler = SlurmScheduler(client)

    def agent(self) -> AgentClient:
        return self.client

    def scheduler(self) -> SlurmScheduler:
        return self._scheduler


STUB_SBATCH = """
# records its argv, TZ, SLURM_TIME_FORMAT and standard input; answers like sbatch --test-only
import json, os, sys
with open(os.environ["CALLS"], "a") as calls:
    calls.write(json.dumps({"argv": sys.argv[1:], "tz": os.environ.get("TZ"),
                            "format": os.environ.get("SLURM_TIME_FORMAT"),
                            "stdin": sys.stdin.read()}) + "\\n")
if "--partition=nosuch" in sys.argv:
    sys.stderr.write("sbatch: error: invalid partition specified: nosuch\\n"
                     "allocation failure: Invalid partition name specified\\n")
    sys.exit(1)
sys.stderr.write("sbatch: Job 5 to start at 2099-01-01T00:00:00 using 1 processors on nodes g1 "
                 "in partition gpu\\n")
"""


def test_the_agent_probes_every_spec_and_reads_the_document_in_one_round_trip(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(f"#!{sys.executable}\n{STUB_SBATCH}")
    (bindir / "sbatch").chmod(0o755)
    calls = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv("TZ", "America/New_York")
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    transport = LocalTransport(default_timeout=60)
    client = AgentClient(transport, str(tmp_path / "base"), python=sys.executable)
    slurm = SlurmResource(ssh=SSHConnectionResource(host="login.invalid", user="u"),
                          remote_base=str(tmp_path / "base"), queue=QUEUE)
    session = RunSession(slurm, str(uuid.uuid4()), HEAD, RayLauncher(), activation=lambda: None)
    local = _LocalSlurm(client)
    session.context.io = AgentSessionIO(local, session.paths, session.initial_document())
    client.install()
    candidates = [Worker(partition="gpu"), Worker(partition="nosuch"), Worker(partition="cpu")]
    before = transport.stats.round_trips
    estimates = session.estimate_worker_starts(candidates, SbatchTestOnlyEstimator())
    assert transport.stats.round_trips - before == 1
    assert local.scheduler().stats.by_command == {"sbatch_test": 3}
    recorded = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(recorded) == 3
    for record, estimate in zip(recorded, estimates, strict=True):
        assert sorted(record["argv"]) == sorted(["--test-only", *estimate.options])
        assert record["argv"][-1].startswith("--"), "no script path: the script is on stdin"
        assert (record["tz"], record["format"], record["stdin"]) == ("UTC0", "standard",
                                                                     TEST_ONLY_SCRIPT)
    gpu, bad, _cpu = estimates
    assert bad.error == "Invalid partition name specified" and bad.start_in_seconds is None
    start = datetime(2099, 1, 1, tzinfo=timezone.utc).timestamp()
    assert gpu.start_in_seconds == pytest.approx(start - time.time(), abs=60)
    assert gpu.nodes == ("g1",) and gpu.partition == "gpu"


def test_the_session_resource_passes_the_contexts_session_on(monkeypatch: pytest.MonkeyPatch):
    from dagster_slurm.session.frontend.resource import SlurmSessionResource

    session, cluster = _session()
    resource = SlurmSessionResource(slurm=session.slurm, launcher=RayLauncher())
    contexts: list[object] = []

    def get_session(self: SlurmSessionResource, context: object) -> RunSession:
        contexts.append(context)
        return session

    monkeypatch.setattr(SlurmSessionResource, "get_session", get_session)
    context = object()
    candidates = [Worker(partition="gpu")]
    assert resource.worker_sbatch_options(context, candidates) == session.worker_sbatch_options(
        candidates)
    (estimate,) = resource.estimate_worker_starts(context, candidates, _estimator(cluster))
    assert estimate.start_in_seconds == pytest.approx(1800) and contexts == [context, context]
