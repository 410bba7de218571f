"""The accounting associations of the development cluster's users.

The cluster enforces associations and their limits (``AccountingStorageEnforce`` in
``slurm.conf``), as most sites do: a user without an association cannot submit at all.
``up`` therefore gives every account of the cluster (the submitter, the second user and
root) an association in one Slurm account, :data:`ACCOUNT`, with no limits of its own.
Tests set limits on these associations with ``sacctmgr -i modify user ... set ...`` and
reset them afterwards (``set MaxSubmitJobs=-1``).

The argv builders are pure; :func:`ensure_associations` runs them (idempotently: an
association that exists is left as it is, and so are the limits a test has set).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from dagster_slurm.devcluster.errors import DevClusterError
from dagster_slurm.devcluster.layout import CLUSTER_NAME
from dagster_slurm.devcluster.processes import wait_for

#: The Slurm account of every user of the development cluster.
ACCOUNT = "dagster-slurm"

SlurmRunner = Callable[..., subprocess.CompletedProcess[str]]


def existing_associations_argv() -> tuple[str, ...]:
    """``sacctmgr`` listing the users that have an association in :data:`ACCOUNT`."""
    return (
        "sacctmgr", "--noheader", "--parsable2", "show", "associations",
        f"cluster={CLUSTER_NAME}", f"account={ACCOUNT}", "format=User",
    )


def add_account_argv() -> tuple[str, ...]:
    """``sacctmgr`` adding :data:`ACCOUNT` to the cluster (answers 'Nothing new' if it exists)."""
    return (
        "sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={CLUSTER_NAME}",
        "description=dagster-slurm development cluster", "organization=dev",
    )


def add_users_argv(users: Sequence[str]) -> tuple[str, ...]:
    """``sacctmgr`` giving ``users`` an association in :data:`ACCOUNT` (their default)."""
    return (
        "sacctmgr", "-i", "add", "user", ",".join(users), f"account={ACCOUNT}",
        f"defaultaccount={ACCOUNT}", f"cluster={CLUSTER_NAME}",
    )


def cluster_argv() -> tuple[str, ...]:
    """``sacctmgr`` listing the cluster with its controller's port (0 or empty until the
    controller has registered with slurmdbd)."""
    return ("sacctmgr", "--noheader", "--parsable2", "show", "cluster", CLUSTER_NAME,
            "format=Cluster,ControlPort")


def registered(text: str) -> bool:
    """Whether :func:`cluster_argv` output shows the cluster registered by its controller."""
    for line in text.splitlines():
        name, _, port = line.strip().partition("|")
        if name == CLUSTER_NAME and port.strip() not in ("", "0"):
            return True
    return False


def parse_users(text: str) -> frozenset[str]:
    """Users of ``sacctmgr --parsable2 show associations format=User`` output (account line
    has an empty user and is skipped)."""
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


def ensure_associations(slurm: SlurmRunner, users: Sequence[str],
                        register_timeout: float = 20.0) -> str:
    """Create :data:`ACCOUNT` and the associations of ``users`` that are missing; return
    what was done. ``slurm`` runs a Slurm client command against the cluster. Waits up to
    ``register_timeout`` seconds for the controller to have registered the cluster with
    slurmdbd (accounts can only be added to a known cluster)."""
    if not wait_for(lambda: registered(slurm(*cluster_argv()).stdout), register_timeout, 0.2):
        raise DevClusterError(f"slurmctld did not register the cluster {CLUSTER_NAME} with "
                              f"slurmdbd within {register_timeout:g} s")
    listed = slurm(*existing_associations_argv())
    if listed.returncode != 0:
        raise DevClusterError(f"sacctmgr show associations failed: {listed.stderr.strip()}")
    present = parse_users(listed.stdout)
    missing = [user for user in users if user not in present]
    if not missing:
        return "all present"
    for argv in (add_account_argv(), add_users_argv(missing)):
        proc = slurm(*argv)
        # sacctmgr exits 1 with " Nothing new added." when everything already exists.
        if proc.returncode != 0 and "Nothing new added" not in proc.stdout + proc.stderr:
            raise DevClusterError(
                f"{' '.join(argv)} failed: {(proc.stderr or proc.stdout).strip()}"
            )
    return "added " + ", ".join(missing)
