"""pytest plugin: the development Slurm cluster as a fixture shared by the whole test run.

Loaded automatically (``pytest11`` entry point) wherever dagster-slurm is installed, so
importing this module must stay cheap: the cluster code is imported only when a test
asks for the cluster.

Fixtures:

``slurm_cluster``
    One per test run. Brings the development cluster up (idempotent; see
    :class:`dagster_slurm.devcluster.DevCluster`) and returns its
    :class:`~dagster_slurm.devcluster.DevClusterInfo`. At the end of the run it stops
    the cluster again only if the cluster was not already fully running before, and
    never with ``--dev-cluster-keep`` or under pytest-xdist. When the cluster cannot be started (not root, no
    apt, a daemon fails) the tests that use it are skipped with the reason; when the
    environment variable ``CI`` is ``true`` they fail instead.
``slurm_env``
    One per test run. The environment variables of ``dagster-slurm dev-cluster env`` as a
    dict (``SLURM_EDGE_NODE_HOST``, ``SLURM_EDGE_NODE_PORT``, ...).

Tests carrying the marker named by the ini option ``dagster_slurm_cluster_marker``
(default ``integration``; empty to turn this off) get ``slurm_cluster`` automatically.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from dagster_slurm.devcluster import DevClusterInfo

KEEP_OPTION = "--dev-cluster-keep"
MARKER_INI = "dagster_slurm_cluster_marker"
_DEFAULT_MARKER = "integration"
_log = logging.getLogger("dagster_slurm.devcluster")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dagster-slurm", "dagster-slurm development cluster")
    group.addoption(
        KEEP_OPTION,
        action="store_true",
        default=False,
        help="leave the development Slurm cluster running after the test run, even if "
        "the run started it",
    )
    parser.addini(
        MARKER_INI,
        "tests with this marker use the slurm_cluster fixture (empty: no marker)",
        default=_DEFAULT_MARKER,
    )


def pytest_configure(config: pytest.Config) -> None:
    marker = _marker(config)
    if marker:
        config.addinivalue_line(
            "markers",
            f"{marker}: needs the dagster-slurm development cluster (started on demand)",
        )


def _marker(config: pytest.Config) -> str:
    return str(config.getini(MARKER_INI) or "").strip()


def in_ci() -> bool:
    """True when running under CI (``CI=true``), where an unavailable cluster is an error."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _unavailable(reason: str) -> NoReturn:
    message = f"development Slurm cluster unavailable: {reason}"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest) -> DevClusterInfo:
    """Connection details of a running development cluster (started if needed)."""
    from dagster_slurm.devcluster import DevCluster, DevClusterError

    cluster = DevCluster(progress=_log.info)
    try:
        was_running = cluster.status().ok
        info = cluster.up()
    except DevClusterError as exc:
        reason = str(exc)
    else:
        # pytest-xdist workers share one cluster and cannot know who finishes last.
        shared = bool(os.environ.get("PYTEST_XDIST_WORKER"))
        if not (was_running or shared or request.config.getoption(KEEP_OPTION)):
            request.addfinalizer(cluster.down)
        return info
    _unavailable(reason)


@pytest.fixture(scope="session")
def slurm_env(slurm_cluster: DevClusterInfo) -> dict[str, str]:
    """Environment variables pointing clients at the development cluster."""
    return slurm_cluster.env()


@pytest.fixture(autouse=True)
def _dagster_slurm_marked_tests(request: pytest.FixtureRequest) -> None:
    """Give tests carrying the configured marker the ``slurm_cluster`` fixture."""
    marker = _marker(request.config)
    if marker and request.node.get_closest_marker(marker) is not None:
        request.getfixturevalue("slurm_cluster")
