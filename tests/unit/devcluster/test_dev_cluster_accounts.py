"""The dev cluster's associations: created once, kept afterwards (fake sacctmgr)."""

from __future__ import annotations

import subprocess

from dagster_slurm.devcluster import accounts


class FakeSacctmgr:
    def __init__(self) -> None:
        self.users: set[str] = set()
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *argv: str) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if "cluster" in argv and "show" in argv:
            return subprocess.CompletedProcess(argv, 0, "dagsterdev|18817\n", "")
        if "show" in argv:
            return subprocess.CompletedProcess(argv, 0, "\n" + "\n".join(sorted(self.users)), "")
        if "user" in argv:
            self.users |= set(argv[argv.index("user") + 1].split(","))
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_associations_are_added_once_for_the_missing_users() -> None:
    fake = FakeSacctmgr()
    fake.users = {"root"}
    assert accounts.ensure_associations(fake, ("dslurm", "dslurm2", "root")) == (
        "added dslurm, dslurm2")
    added = [c for c in fake.calls if "add" in c]
    assert added[0][:4] == ("sacctmgr", "-i", "add", "account")
    assert "dslurm,dslurm2" in added[1] and "account=dagster-slurm" in added[1]
    fake.calls.clear()
    assert accounts.ensure_associations(fake, ("dslurm", "dslurm2", "root")) == "all present"
    assert not [c for c in fake.calls if "add" in c or "modify" in c]


def test_registration_needs_a_controller_port() -> None:
    assert accounts.registered("dagsterdev|18817\n")
    assert not accounts.registered("dagsterdev|0\n") and not accounts.registered("")
