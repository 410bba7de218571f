"""Describe the running Python interpreter as one JSON object on standard output.

Stdlib only, Python 3.8+. :func:`dagster_slurm.environment.cluster.platform.probe_cluster`
sends this file's text to the login node as ``<python> -I -c <text>`` through the agent's
``exec``; the local side imports it and calls :func:`describe`, so both sides answer the
same questions the same way. Keys:

``python_version`` ([major, minor, micro]), ``implementation`` (``cpython``, ``pypy``),
``abiflags``, ``soabi``, ``platform`` (``sysconfig.get_platform()``), ``machine``,
``pointer_bits``, ``glibc`` (``"2.36"`` or null), ``musl`` (``"1.2"`` or null),
``executable``, ``has_venv``.
"""

import glob
import json
import os
import platform
import re
import struct
import subprocess
import sys
import sysconfig


def _glibc():
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        return None
    if not text or not text.startswith("glibc "):
        return None
    return text.split()[1]


def _musl():
    for loader in sorted(glob.glob("/lib/ld-musl-*.so.1")):
        try:
            out = subprocess.run([loader], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        match = re.search(r"Version (\d+)\.(\d+)", out.stderr.decode("utf-8", "replace"))
        if match:
            return "{}.{}".format(*match.groups())
    return None


def _has_module(name):
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def describe():
    """The interpreter's description (see the module docstring)."""
    glibc = _glibc()
    return {
        "python_version": list(sys.version_info[:3]),
        "implementation": sys.implementation.name,
        "abiflags": getattr(sys, "abiflags", ""),
        "soabi": sysconfig.get_config_var("SOABI"),
        "platform": sysconfig.get_platform(),
        "machine": platform.machine(),
        "pointer_bits": struct.calcsize("P") * 8,
        "glibc": glibc,
        "musl": None if glibc else _musl(),
        "executable": sys.executable,
        "has_venv": _has_module("venv"),
    }


if __name__ == "__main__":
    json.dump(describe(), sys.stdout)
