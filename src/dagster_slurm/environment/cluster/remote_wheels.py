"""The cluster's shared wheel store: link cached wheels into a build, add uploaded ones.

Stdlib only, Python 3.8+; run on the login node as ``<python> -I -c <this file's text>
<mode> <store> <wheels dir>`` by the agent's ``exec`` (no shell), with a JSON list of
``[sha256, file name]`` pairs on standard input. The store keeps each wheel once, as
``<store>/<sha256>/<file name>``, shared by every environment under the same base.

``link``: for each pair present in the store, create the symlink ``<wheels dir>/<file
name>`` to it; print the JSON list of pairs that are missing (to be uploaded).

``store``: for each pair, hard-link ``<wheels dir>/<file name>`` into the store (atomic; an
entry already present is kept; a copy and rename where hard links are refused); print the
number added. Run only after pip installed the wheels with ``--require-hashes``, so only
verified files enter the store.
"""

import json
import os
import shutil
import sys


def _entry(store, sha, name):
    if "/" in sha or "/" in name or name.startswith(".") or sha.startswith("."):
        raise SystemExit(f"refusing unsafe store entry {[sha, name]!r}")
    return os.path.join(store, sha, name)


def link(store, wheels, pairs):
    os.makedirs(wheels, exist_ok=True)
    missing = []
    for sha, name in pairs:
        cached = _entry(store, sha, name)
        if os.path.isfile(cached):
            os.symlink(cached, os.path.join(wheels, name))
        else:
            missing.append([sha, name])
    return missing


def add(store, wheels, pairs):
    added = 0
    for sha, name in pairs:
        target = _entry(store, sha, name)
        if os.path.exists(target):
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        source = os.path.join(wheels, name)
        try:
            os.link(source, target)
        except FileExistsError:
            continue
        except OSError:
            tmp = f"{target}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        added += 1
    return added


def main(argv):
    mode, store, wheels = argv
    pairs = json.load(sys.stdin)
    if mode == "link":
        result = link(store, wheels, pairs)
    elif mode == "store":
        result = add(store, wheels, pairs)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
