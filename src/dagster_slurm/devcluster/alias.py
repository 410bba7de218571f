"""A round-robin TCP alias: one listening address whose connections go to several login
nodes in turn, like a site's DNS name with one address record per login node.

Stdlib only: ``up`` runs this file as a program (``python alias.py --listen HOST:PORT
--to HOST:PORT --to HOST:PORT --pid-file FILE --log FILE``). Each accepted connection is
forwarded to the next target in order; a target that refuses the connection is skipped
for that connection (the next one is tried), as an SSH client tries the next address of a
name. One log line per connection names the target it reached, so tests can see the
spread. The process renames itself ``login-alias`` (``/proc/self/comm``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
import time

COMM = "login-alias"


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` as a pair; raises ValueError for anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not HOST:PORT: {text!r}")
    return host, int(port)


def next_targets(turn: int, targets: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The order in which connection number ``turn`` tries the targets: its own first."""
    start = turn % len(targets)
    return targets[start:] + targets[:start]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass


class Alias:
    """Accepts connections and forwards each to the next target (see the module docstring)."""

    def __init__(self, targets: list[tuple[str, int]], log) -> None:
        self.targets = targets
        self.turns = itertools.count()
        self.log = log

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        turn = next(self.turns)
        peer = writer.get_extra_info("peername")
        for host, port in next_targets(turn, self.targets):
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError as exc:
                self.log(f"connection {turn} from {peer}: {host}:{port} refused ({exc})")
                continue
            self.log(f"connection {turn} from {peer} -> {host}:{port}")
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                for w in (up_writer, writer):
                    w.close()
            return
        self.log(f"connection {turn} from {peer}: no target answered")
        writer.close()


async def serve(listen: tuple[str, int], targets: list[tuple[str, int]], log) -> None:
    alias = Alias(targets, log)
    server = await asyncio.start_server(alias.handle, listen[0], listen[1], reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log(f"listening on {listen[0]}:{listen[1]}, round robin over "
        + ", ".join(f"{h}:{p}" for h, p in targets))
    await stop.wait()
    server.close()  # open connections end with the process (asyncio.run cancels them)
    log("stopped")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="login-alias")
    parser.add_argument("--listen", required=True, type=parse_address)
    parser.add_argument("--to", required=True, action="append", type=parse_address)
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args(argv)
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(COMM)
    except OSError:
        pass
    log_file = open(args.log, "a", buffering=1)

    def log(line: str) -> None:
        log_file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")

    tmp = f"{args.pid_file}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, args.pid_file)
    asyncio.run(serve(args.listen, args.to, log))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
