"""``dagster-slurm login [--status]`` and ``dagster-slurm logout`` (argument parsing only)."""

from __future__ import annotations

import argparse
import sys

from dagster_slurm.errors import ConfigurationError
from dagster_slurm.logins import master
from dagster_slurm.resources.ssh import SSHConnectionResource
from dagster_slurm.transport.login_place import LOGIN_DIR_ENV, LoginPlace
from dagster_slurm.transport.ssh_target import SSHTarget

ENV_PREFIX = "SLURM_EDGE_NODE_"


def _jump(text: str, known_hosts: str | None) -> SSHConnectionResource:
    """``[user@]host[:port]`` of a jump host."""
    who, _, rest = text.rpartition("@")
    host, _, port = rest.partition(":")
    if not host or (port and not port.isdigit()):
        raise ConfigurationError("--jump", text, "must be [user@]host[:port]")
    fields: dict[str, object] = {"host": host, "known_hosts_path": known_hosts}
    if who:
        fields["user"] = who
    if port:
        fields["port"] = int(port)
    return SSHConnectionResource(**fields)


def target_of(args: argparse.Namespace, environ: dict[str, str] | None = None) -> SSHTarget:
    """The login target: the ``<prefix>*`` variables as read by
    :meth:`SSHConnectionResource.from_env`, each overridden by the option given, resolved
    as the resource resolves it (``~/.ssh/config`` included)."""
    try:
        resource = SSHConnectionResource.from_env(args.prefix, environ)
    except ConfigurationError as exc:
        if not args.host:
            raise ConfigurationError(
                "--host", None,
                f"is required when the environment does not name the login node ({exc})",
            ) from None
        resource = SSHConnectionResource(host=args.host)
    changes: dict[str, object] = {"password": None}
    for option, field in (("host", "host"), ("port", "port"), ("user", "user"),
                          ("key", "key_path"), ("known_hosts", "known_hosts_path")):
        value = getattr(args, option)
        if value is not None and value != "":
            changes[field] = value
    if args.jump:
        changes["jump_host"] = _jump(args.jump, changes.get("known_hosts_path",  # type: ignore[arg-type]
                                                            resource.known_hosts_path))
    return resource.model_copy(update=changes).to_target()


def _login(args: argparse.Namespace) -> int:
    target = target_of(args)
    place = LoginPlace.of(target)
    if args.status:
        current = master.status(place)
        print(current.render())
        return 0 if current.up else 1
    idle = master.parse_duration(args.persist)
    print(f"logging in to {target.label}; answer the site's questions below", flush=True)
    result = master.start(target, place, idle)
    print(result.render())
    return 0


def _logout(args: argparse.Namespace) -> int:
    target = target_of(args)
    place = LoginPlace.of(target)
    if master.stop(place):
        print(f"shared login to {place.label} ended")
    else:
        print(f"no shared login to {place.label} was up")
    return 0


def _target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help=f"login node (default: {ENV_PREFIX}HOST)")
    parser.add_argument("--port", type=int, default=None,
                        help=f"SSH port (default: {ENV_PREFIX}PORT, else 22)")
    parser.add_argument("--user", help=f"cluster user (default: {ENV_PREFIX}USER)")
    parser.add_argument("--key", help=f"private key file (default: {ENV_PREFIX}KEY_PATH)")
    parser.add_argument("--known-hosts", help=f"known_hosts file ({ENV_PREFIX}KNOWN_HOSTS)")
    parser.add_argument("--jump", help="bastion as [user@]host[:port] (default: "
                        f"{ENV_PREFIX}JUMP_HOST)")
    parser.add_argument("--prefix", default=ENV_PREFIX,
                        help=f"prefix of the environment variables (default {ENV_PREFIX})")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``login`` and ``logout`` commands."""
    login = subparsers.add_parser(
        "login", help="log in to the cluster once for every process of this user here",
        description="Start a shared SSH login (OpenSSH ControlMaster) that every process of "
        "this user on this machine uses: runs, steps, sensors, the code server. ssh asks on "
        "this terminal for what the site wants (password, one-time code, key passphrase). "
        f"The control socket lives in ${LOGIN_DIR_ENV} (default ~/.dagster-slurm/logins, "
        "mode 0700).",
    )
    _target_options(login)
    login.add_argument("--persist", default="12h",
                       help="how long the login stays up after its last command (default 12h)")
    login.add_argument("--status", action="store_true",
                       help="say whether the shared login is up, as whom, to where, since when; "
                       "exit 1 when it is not")
    login.set_defaults(handler=_login)
    logout = subparsers.add_parser("logout", help="end the shared login started by login")
    _target_options(logout)
    logout.set_defaults(handler=_logout)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: dagster-slurm login ...")
