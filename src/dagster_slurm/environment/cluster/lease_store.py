"""A :class:`~dagster_slurm.state.store.StateStore` for one small lease document on the cluster.

The build of an environment is guarded by a lease (:mod:`dagster_slurm.state.lease`) kept in
``<envs>/.builds/<hash>.lease.json`` and locked by the directory ``<hash>.lock``; each call
is one agent round trip. The document holds nothing but ``{"leases": {...}}``.
:class:`LeaseKeeper` keeps a lease alive while a long build runs.
"""

from __future__ import annotations

import logging
import threading

from dagster_slurm.agent.client import AgentClient
from dagster_slurm.agent.ops import read_op, txn_op
from dagster_slurm.agent.results import TxnResult
from dagster_slurm.errors import DagsterSlurmError
from dagster_slurm.state import lease
from dagster_slurm.state.store import Patch, Snapshot, StateStore


class LeaseFileStore(StateStore):
    """The lease document at ``path``, locked by the directory ``lock_path``."""

    def __init__(
        self, agent: AgentClient, path: str, lock_path: str, lock_timeout: float = 30.0
    ) -> None:
        self.agent = agent
        self.path = path
        self.lock_path = lock_path
        self.lock_timeout = lock_timeout

    def snapshot(self) -> Snapshot:
        op = read_op(self.path)
        response = self.agent.call([op.to_request()], timeout=self.agent.budget([op]))
        result = op.decode(response.results[0], 0)
        return Snapshot(result.doc, result.version, response.now)

    def transact(self, patch: Patch) -> TxnResult:
        return self.agent.run(
            txn_op(
                self.path,
                self.lock_path,
                patch,
                lock_timeout=self.lock_timeout,
                create={"leases": {}},
                dir_mode=0o755,  # the environment store is shared with other users on purpose
            )
        )


class LeaseKeeper:
    """Renews a held lease from a daemon thread every ``ttl / 4`` seconds until the ``with``
    block ends, then releases it.

    A short ``ttl`` thus suffices for builds of any length, and the lease of a killed
    builder expires within ``ttl``. A failed renewal is logged; the build goes on (its
    publishing step stays safe without the lease, see the deploy module).
    """

    def __init__(
        self,
        store: StateStore,
        name: str,
        owner: str,
        ttl: float,
        log: logging.Logger | logging.LoggerAdapter,
    ) -> None:
        self.store = store
        self.name = name
        self.owner = owner
        self.ttl = ttl
        self.log = log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"lease-{name}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.ttl)
        try:
            lease.release(self.store, self.name, self.owner)
        except DagsterSlurmError as exc:
            self.log.warning("could not release the lease %r: %s", self.name, exc)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                grant = lease.renew(self.store, self.name, self.owner, self.ttl)
            except DagsterSlurmError as exc:
                self.log.warning("could not renew the lease %r: %s", self.name, exc)
                continue
            if not grant.acquired:
                self.log.warning("lost the lease %r; another process may build too", self.name)
                return
