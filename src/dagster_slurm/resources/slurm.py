"""``SlurmResource``: the cluster a job goes to and the scheduler defaults it gets.

The resource holds configuration only. :meth:`SlurmResource.scheduler` returns the
process-wide :class:`~dagster_slurm.scheduler.client.SlurmScheduler` for these settings,
built on the shared SSH connection and the cluster-side agent installed under
``remote_base``. A ``remote_base`` starting with ``$HOME/`` or ``~/`` is resolved against
the login user's home on the cluster when the connection is first made
(:meth:`SlurmResource.base_path`).
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
from collections.abc import Callable, Mapping

from dagster import ConfigurableResource
from pydantic import Field, ValidationError, ValidationInfo, field_validator

from dagster_slurm.agent import AgentClient
from dagster_slurm.config_errors import KnownFieldsOnly, Moved, in_given_words
from dagster_slurm.errors import ConfigurationError, TransportError
from dagster_slurm.resources import published_env
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.scheduler.client import SlurmScheduler
from dagster_slurm.scheduler.submit_wait import LimitWait
from dagster_slurm.slurm.queue import SlurmQueueConfig

#: How a ``remote_base`` may name the login user's home on the cluster (followed by ``/``
#: and the rest of the path, or alone).
HOME_PREFIXES: tuple[str, ...] = ("$HOME", "${HOME}", "~")

_CACHE: dict[tuple, tuple[str, SlurmScheduler]] = {}
_USERS: dict[tuple, int] = {}
_CACHE_LOCK = threading.Lock()
_log = logging.getLogger("dagster_slurm")


class SlurmResource(ConfigurableResource, KnownFieldsOnly):
    """A Slurm cluster reached over SSH, with the default queue settings of its jobs."""

    ssh: SSHConnectionResource = Field(description="How to reach the cluster's login node.")
    queue: SlurmQueueConfig = Field(
        default_factory=SlurmQueueConfig,
        description="Default partition, shape and walltime of jobs; assets may override fields.",
    )
    remote_base: str | None = Field(
        default=None,
        description=(
            "Directory on the cluster's shared filesystem for the library's files "
            "(cluster-side program, job directories, session state): an absolute path, or "
            "one starting with $HOME/, ${HOME}/ or ~/ for the login user's home on the "
            "cluster (looked up once per process, when connecting). None: $HOME/dagster-slurm."
        ),
    )
    python: str = Field(
        default="python3",
        description="Python interpreter (>= 3.8) on the login node that runs the cluster-side program.",
    )
    submit_interval: float = Field(
        default=0.2,
        description="Minimum seconds between two submissions from one process (sbatch rate limit).",
    )
    status_max_age: float = Field(
        default=2.0,
        description=(
            "Seconds a squeue answer may be old to serve a job's status poll. Every process of "
            "the login user shares one answer (a file under remote_base on the login node), "
            "so however many runs poll, the scheduler sees about one squeue per this many "
            "seconds; a poll that needs a newer answer (a job it does not list yet, a payload "
            "that has just ended) still gets one. 0: each poll needs an answer taken after it "
            "started (concurrent polls still share one). Poll intervals are a floor on top."
        ),
    )
    submit_limit_timeout: float | None = Field(
        default=None,
        description=(
            "Seconds a submission may wait when Slurm refuses it for a limit on queued jobs "
            "(MaxSubmitJobs of the user's association, MaxSubmitJobsPerUser of a QOS, and "
            "their account and group variants). Such a refusal is not a failure: the step "
            "logs the limit and how many of the user's jobs are queued, backs off and "
            "submits again once a job has ended, and stops waiting, submitting nothing, when "
            "its run ends. After this many seconds it fails with an error naming the limit. "
            "None: wait for ever. A limit the job can never meet (walltime or size above the "
            "association's or QOS's per-job limit) fails at once whatever this is."
        ),
    )

    @field_validator("submit_limit_timeout", mode="before")
    @classmethod
    def _check_limit_timeout(cls, value: object) -> object:
        # before coercion, so that the error shows the value as it was written
        if isinstance(value, int | float) and not isinstance(value, bool) and not value > 0:
            raise ValueError(f"submit_limit_timeout={value!r}: must be > 0 seconds, or None "
                             "to wait for ever")
        return value

    @field_validator("remote_base")
    @classmethod
    def _check_base(cls, value: str | None) -> str | None:
        if value is None:
            return value
        rest = value if value.startswith("/") else home_relative(value)
        if rest is not None and "$" in rest:
            raise ValueError(
                f"remote_base={value!r}: variables are not expanded here, only a leading "
                "$HOME/ or ~/ (the login user's home on the cluster); write the absolute "
                "path the variable stands for"
            )
        if rest is not None:
            return value
        raise ValueError(
            f"remote_base={value!r}: must be an absolute path on the cluster, or start with "
            "$HOME/ or ~/ (the login user's home there); no other variable or ~user is "
            "expanded, so write the absolute path it stands for"
        )

    @field_validator("submit_interval", "status_max_age")
    @classmethod
    def _check_interval(cls, value: float, info: ValidationInfo) -> float:
        if value < 0:
            raise ValueError(f"{info.field_name}={value!r}: must be >= 0")
        return value

    @classmethod
    def from_env(
        cls,
        prefix: str = "SLURM_EDGE_NODE_",
        environ: Mapping[str, str] | None = None,
        queue: SlurmQueueConfig | None = None,
    ) -> SlurmResource:
        """SSH settings from ``<prefix>*`` (see :meth:`SSHConnectionResource.from_env`),
        ``remote_base`` from ``SLURM_DEPLOYMENT_BASE_PATH`` (or, with a deprecation
        warning, the published package's ``SLURM_REMOTE_BASE``) and, when ``queue`` is
        None, the queue defaults from ``SLURM_PARTITION``, ``SLURM_TIME``, ``SLURM_CPUS``,
        ``SLURM_MEM``, ``SLURM_MEM_PER_CPU``, ``SLURM_NUM_NODES``, ``SLURM_GPUS_PER_NODE``,
        ``SLURM_QOS``, ``SLURM_RESERVATION``, ``SLURM_ACCOUNT`` and
        ``SLURM_SIGNAL_BEFORE_TIMEOUT`` (the published package's variables; see
        :mod:`dagster_slurm.resources.published_env`). A bad value raises
        :class:`ConfigurationError` naming the variable."""
        env = os.environ if environ is None else environ
        if queue is None:
            values = published_env.queue_values(env)
            try:
                queue = SlurmQueueConfig(**values)
            except ValidationError as error:
                raise in_given_words(error, [
                    Moved(published_env.variable_of(field), (field,), value)
                    for field, value in values.items()
                ]) from None
        ssh = SSHConnectionResource.from_env(prefix=prefix, environ=env)
        base, variable = published_env.remote_base(env)
        try:
            return cls(ssh=ssh, queue=queue, remote_base=base)
        except ValidationError as error:
            raise in_given_words(error, [Moved(variable, ("remote_base",), base)]) from None

    def base_path(self) -> str:
        """The deployment base path: ``remote_base`` with a leading ``$HOME``/``~`` replaced
        by the login user's home on the cluster, or ``$HOME/dagster-slurm`` when it is None
        (the home is looked up once per process, when connecting)."""
        return self._runtime()[0]

    def scheduler(self) -> SlurmScheduler:
        """The process-wide scheduler client for these settings."""
        return self._runtime()[1]

    def limit_wait(self, emit: Callable[[str], None],
                   check: Callable[[], None] | None = None) -> LimitWait:
        """How a submission of a step waits under a submission limit: log lines to
        ``emit``, ``check`` raising once the step's run has ended, bounded by
        ``submit_limit_timeout``."""
        return LimitWait(emit, check, self.submit_limit_timeout)

    def agent(self) -> AgentClient:
        """The cluster-side program's client used by :meth:`scheduler`."""
        return self.scheduler().agent

    def acquire(self) -> None:
        """Count one user of this process's connection (see :meth:`release`)."""
        with _CACHE_LOCK:
            _USERS[self._key()] = _USERS.get(self._key(), 0) + 1

    def release(self) -> None:
        r"""Drop one user; the last one :meth:`close`\ s the connection and agent processes.

        Runs of one process (threads of an in-process executor, or sequential runs) share
        the connection, so a run's teardown must not close it under another run.
        """
        with _CACHE_LOCK:
            left = _USERS.get(self._key(), 0) - 1
            if left > 0:
                _USERS[self._key()] = left
                return
            _USERS.pop(self._key(), None)
        self.close()

    def close(self) -> None:
        """End this process's cluster-side agent processes and SSH connection for these
        settings now, whoever else uses them; a later call reconnects."""
        with _CACHE_LOCK:
            cached = _CACHE.pop(self._key(), None)
        if cached is not None:
            cached[1].agent.close()
        self.ssh.get_transport().close()

    def _key(self) -> tuple:
        return (os.getpid(), self.ssh.to_target(), self.ssh.to_options(), self.ssh.shared_login,
                self.remote_base, self.python)

    def _runtime(self) -> tuple[str, SlurmScheduler]:
        key = self._key()
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
            if cached is not None:
                return cached
        transport = self.ssh.get_transport()
        base = self.remote_base or "$HOME/dagster-slurm"
        rest = home_relative(base)
        if rest is not None:
            home = _remote_home(transport)
            base = posixpath.join(home, rest).rstrip("/") if rest else home
        local = node_local_reason(base)
        if local is not None:
            _log.warning("deployment base path %s: %s", base, local)
        scheduler = SlurmScheduler(
            AgentClient(transport, base, self.python, persistent=True,
                        where=self.ssh.to_target().label, learn_slurm_version=True),
            submit_interval=self.submit_interval,
            status_max_age=self.status_max_age,
            status_path=f"{base.rstrip('/')}/status/squeue-{{uid}}.json",
        )
        with _CACHE_LOCK:
            return _CACHE.setdefault(key, (base, scheduler))


#: Directories that each login node has for itself: behind a name with several login nodes,
#: a base path below one of them is seen by one node only.
NODE_LOCAL_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/user")


def node_local_reason(base: str) -> str | None:
    """Why ``base`` (an absolute deployment base path) is not shared by the cluster's login
    nodes, or None: below a node-local directory (:data:`NODE_LOCAL_DIRS`), the session
    documents, locks, heartbeats, shared squeue answer, agent and environments it holds are
    seen only by processes logged in to the same login node."""
    normal = posixpath.normpath(base)
    for directory in NODE_LOCAL_DIRS:
        if normal == directory or normal.startswith(directory + "/"):
            return (f"it lies below {directory}, which each login node has for itself; "
                    "where several login nodes stand behind one name, processes on different "
                    "nodes then do not share their sessions, locks and status answers: put it "
                    "on the shared filesystem (the default is $HOME/dagster-slurm)")
    return None


def home_relative(path: str) -> str | None:
    """The part of ``path`` below the login user's home when it starts with one of
    :data:`HOME_PREFIXES` (``"dagster_runs"`` for ``"$HOME/dagster_runs"``, ``""`` for
    ``"~"`` alone); None when it does not (an absolute path, ``"~alice/x"``,
    ``"$HOMEDIR/x"``)."""
    for prefix in HOME_PREFIXES:
        if path == prefix:
            return ""
        if path.startswith(prefix + "/"):
            return path[len(prefix) + 1:].lstrip("/")
    return None


def _remote_home(transport) -> str:  # noqa: ANN001 - any Transport
    result = transport.run(["printenv", "HOME"])
    home = result.stdout.strip()
    if not result.ok or not home.startswith("/"):
        raise TransportError(
            f"could not determine the login user's home directory ({result.stderr.strip()!r}); "
            "set SlurmResource.remote_base"
        )
    if "\n" in home:
        raise ConfigurationError("HOME", home, "unexpected multi-line home directory")
    return home
