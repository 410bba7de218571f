"""Packing the payload's environment here, on the machine that runs Dagster.

Owns everything that produces the files of a packed environment before anything reaches the
cluster: which distributions go in (:mod:`.requirements`), running pip (:mod:`.pip`), the
local wheel cache (:mod:`.pool`), the wheelhouse for the cluster's platform
(:mod:`.wheelhouse`), pixi-pack (:mod:`.pixi`), content hashes and cache keys
(:mod:`.hashing`), and choosing a packer and turning its output into a
:class:`~dagster_slurm.environment.cluster.remote.Recipe` (:mod:`.packer`).

Nothing here opens a connection to the cluster; the platform to pack for comes in as a
:class:`~dagster_slurm.environment.cluster.platform.PythonPlatform`.
"""
