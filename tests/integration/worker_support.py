"""Reading a worker allocation's files in the dev-cluster tests (the session directory is
on this host's filesystem)."""

from dagster_slurm.session.session import RunSession


def read_text(path: str) -> str:
    """The file's text; empty when it does not exist (yet)."""
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def ray_nodes(session: RunSession, job_id: str) -> dict[str, tuple[str, str]]:
    """Worker allocation ``job_id``'s joined nodes: host -> (Ray node id, head job id)."""
    rows = [line.split() for line in read_text(session.paths.ray_nodes(job_id)).splitlines()]
    return {row[0]: (row[1], row[2]) for row in rows if len(row) == 3}
