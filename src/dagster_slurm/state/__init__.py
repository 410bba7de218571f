"""Session state: the session document's schema, the stores that hold it, and leases."""

from dagster_slurm.agent.remote.patch import make_pointer
from dagster_slurm.agent.results import TxnResult
from dagster_slurm.state.lease import (
    LeaseGrant,
    acquire,
    current_holder,
    new_owner_id,
    release,
    renew,
)
from dagster_slurm.state.schema import SCHEMA_VERSION, SessionDocument, new_session_document
from dagster_slurm.state.store import AgentStateStore, MemoryStateStore, Snapshot, StateStore

__all__ = [
    "SCHEMA_VERSION",
    "AgentStateStore",
    "LeaseGrant",
    "MemoryStateStore",
    "SessionDocument",
    "Snapshot",
    "StateStore",
    "TxnResult",
    "acquire",
    "current_holder",
    "make_pointer",
    "new_owner_id",
    "new_session_document",
    "release",
    "renew",
]
