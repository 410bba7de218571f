"""Choosing a packer and turning its output into a
:class:`~dagster_slurm.environment.cluster.remote.Recipe`.

:func:`choose_packer` is the policy (pure): pixi-pack when the configuration asks for it, or
when ``env_packer="auto"``, no ``env_packages`` list is given, ``pixi`` and ``pixi-pack``
are installed here and the project has a pixi manifest; otherwise a wheelhouse.
:func:`pack_environment` runs the chosen packer through the replaceable I/O of
:class:`Packers`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dagster_slurm.environment.cluster.platform import PythonPlatform
from dagster_slurm.environment.cluster.remote import REQUIREMENTS, WHEELS, PackFile, Recipe
from dagster_slurm.environment.config import EnvironmentConfig
from dagster_slurm.environment.errors import EnvironmentSetupError
from dagster_slurm.environment.packing import pixi
from dagster_slurm.environment.packing.pip import PipRunner, run_pip
from dagster_slurm.environment.packing.requirements import InstalledDistribution
from dagster_slurm.environment.packing.wheelhouse import build_wheelhouse


@dataclass(frozen=True)
class Packers:
    """The I/O used for packing: pip, the pixi-pack runner, ``which``, the installed
    distributions (None: read this interpreter's)."""

    pip: PipRunner = run_pip
    pixi_run: pixi.Runner = pixi.run_command
    which: Callable[[str], str | None] = shutil.which
    distributions: Callable[[], Sequence[InstalledDistribution]] | None = None


def choose_packer(
    config: EnvironmentConfig, project: pixi.PixiProject | None, tools_available: bool
) -> str:
    """``pixi`` or ``wheelhouse`` (see the module docstring); raises when pixi is forced
    but unusable."""
    if config.env_packer == "pixi":
        if not tools_available:
            raise EnvironmentSetupError("env_packer='pixi' needs pixi and pixi-pack on PATH")
        if project is None:
            raise EnvironmentSetupError(
                "env_packer='pixi' needs a pixi.toml (or pyproject.toml with [tool.pixi]) in "
                "the project directory or a parent"
            )
        return "pixi"
    if config.env_packer == "auto" and config.env_packages is None and tools_available and project:
        return "pixi"
    return "wheelhouse"


def pack_environment(
    config: EnvironmentConfig,
    cluster: PythonPlatform,
    local: PythonPlatform,
    project_dir: Path,
    packers: Packers,
    log: logging.Logger | logging.LoggerAdapter,
) -> Recipe:
    """Pack the environment of ``config`` for ``cluster`` (cached under the cache dir)."""
    cache = config.cache_dir()
    project = pixi.find_pixi_project(project_dir)
    if choose_packer(config, project, pixi.pixi_tools_available(packers.which)) == "pixi":
        assert project is not None
        pack = pixi.build_pixi_pack(project, cluster, cache, run=packers.pixi_run, log=log)
        return Recipe(
            pixi.KIND,
            pack.env_hash,
            (PackFile(pixi.SCRIPT_NAME, pack.script, pack.sha256),),
            description=f"pixi environment {project.environment!r} for {pack.conda_platform}",
        )
    if not cluster.has_venv:
        raise EnvironmentSetupError(
            f"{cluster.executable or 'python3'} on the login node has no venv module, needed "
            "to install a wheelhouse (Debian/Ubuntu: the python3-venv package); or set "
            "pre_deployed_env_path"
        )
    dists = packers.distributions() if packers.distributions is not None else None
    house = build_wheelhouse(
        config.env_packages, cluster, local, cache, distributions=dists, pip=packers.pip, log=log
    )
    files = tuple(
        PackFile(f"{WHEELS}/{w.filename}", w.path, w.sha256, shared=True) for w in house.files()
    )
    return Recipe(
        "wheelhouse",
        house.env_hash,
        files,
        generated=((REQUIREMENTS, house.requirements_text().encode()),),
        installer=house.installer.filename,
        description=f"{len(house.wheels)} wheels for {cluster.describe()}",
    )
