"""``dagster-slurm dev-cluster up|down|status|env|otp|issue-cert`` (argument parsing only)."""

from __future__ import annotations

import argparse
import sys

from dagster_slurm.devcluster.certs import parse_duration
from dagster_slurm.devcluster.cluster import DevCluster
from dagster_slurm.devcluster.info import DevClusterInfo
from dagster_slurm.devcluster.layout import (
    DEFAULT_STATE_DIR,
    LOGIN_NODES_ENV,
    LOGIN_SITES,
    LOGIN_SITES_ENV,
    MAX_LOGIN_NODES,
    SSH_LISTEN_ENV,
    SSH_PORT_ENV,
    STATE_DIR_ENV,
    USER_ENV,
    parse_login_sites,
)
from dagster_slurm.devcluster.release import RELEASE_ENV, SUITES
from dagster_slurm.transport.certificates import shown_time


def _progress(line: str) -> None:
    print(line, flush=True)


def _cluster(args: argparse.Namespace, progress: bool = True) -> DevCluster:
    return DevCluster(
        state_dir=args.state_dir,
        ssh_port=args.ssh_port,
        user=args.user,
        ssh_listen=args.ssh_listen,
        progress=_progress if progress else None,
        login_sites=getattr(args, "login_sites", None),
        login_nodes=getattr(args, "login_nodes", None),
        slurm_release=getattr(args, "slurm_release", None),
    )


def _login_sites(text: str) -> tuple[str, ...]:
    try:
        return parse_login_sites(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _login_lines(info: DevClusterInfo) -> list[str]:
    """One ``ssh`` command line per way in: the login node, then each login site."""
    target = f"{info.user}@{info.host}"
    lines = [f"login: ssh -i {info.key_path} -p {info.port} {target}"]
    for node in info.login_nodes:
        lines.append(f"{node.name}: ssh -i {info.key_path} -p {node.port} {info.user}@{node.host}")
    for site in info.login_sites:
        if site.name == "otp":
            lines.append(f"otp login: ssh -i {info.key_path} -p {site.port} {target}"
                         "  (code: dagster-slurm dev-cluster otp)")
        elif site.name == "cert":
            lines.append("cert login: dagster-slurm dev-cluster issue-cert --valid 1h; "
                         f"ssh -i {info.cert_key_path} -p {site.port} {target}")
        else:
            # -i does not reach a -J jump host's login; a ProxyCommand passes it on.
            jump = f"ssh -i {info.key_path} -W %h:%p -p {site.port} {target}"
            lines.append(f"bastion: ssh -i {info.key_path} -o ProxyCommand='{jump}' "
                         f"-p {info.port} {target}")
    return lines


def _up(args: argparse.Namespace) -> int:
    info = _cluster(args).up()
    for line in _login_lines(info):
        print(line)
    print(f'environment: eval "$(dagster-slurm dev-cluster env --state-dir {info.state_dir})"')
    return 0


def _down(args: argparse.Namespace) -> int:
    _cluster(args).down(purge=args.purge)
    return 0


def _status(args: argparse.Namespace) -> int:
    status = _cluster(args, progress=False).status()
    print(status.render())
    return 0 if status.ok else 1


def _env(args: argparse.Namespace) -> int:
    for line in _cluster(args, progress=False).info().export_lines():
        print(line)
    return 0


def _otp(args: argparse.Namespace) -> int:
    print(_cluster(args, progress=False).otp_code())
    return 0


def _issue_cert(args: argparse.Namespace) -> int:
    valid = None if args.expired else args.valid
    issued = _cluster(args, progress=False).issue_certificate(args.key, args.out, valid)
    validity = issued.validity
    start = shown_time(validity.valid_after) if validity.valid_after else "always"
    end = shown_time(validity.valid_before) if validity.valid_before else "forever"
    print(issued.path)
    print(f"principal {issued.principal}, valid from {start} to {end}")
    return 0


def _add_site_actions(actions: argparse._SubParsersAction[argparse.ArgumentParser],
                      common: argparse.ArgumentParser) -> None:
    code = actions.add_parser(
        "otp", parents=[common],
        help="print the one-time code the otp login site accepts now (root)",
        description="Print the current time-based one-time code (6 digits, 30 s steps) of "
        "the submitter on the otp login site. Each code logs in once; a second login needs "
        "the code of a later step.",
    )
    code.set_defaults(handler=_otp)
    cert = actions.add_parser(
        "issue-cert", parents=[common],
        help="sign a key with the cluster's user CA for the cert login site (root)",
        description="Sign the public half of a key with the cluster's user CA, for the "
        "submitter as principal, and write the certificate (default <key>-cert.pub, where "
        "OpenSSH and the library find it). Prints its path and validity.",
    )
    validity = cert.add_mutually_exclusive_group()
    validity.add_argument(
        "--valid", type=_duration, default=300, metavar="DURATION",
        help="how long the certificate is valid from now: 90s, 5m, 1h30m, 2d (default 5m)",
    )
    validity.add_argument(
        "--expired", action="store_true",
        help="issue a certificate that expired an hour ago (for testing refusals)",
    )
    cert.add_argument(
        "--key", default=None,
        help="private key (or its .pub) to certify (default: the cluster's certificate key, "
        "DAGSTER_SLURM_DEV_CERT_KEY_PATH of 'env')",
    )
    cert.add_argument("--out", default=None, help="certificate file (default <key>-cert.pub)")
    cert.set_defaults(handler=_issue_cert)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``dev-cluster`` command group."""
    group = subparsers.add_parser(
        "dev-cluster",
        help="start/stop a Slurm cluster of real daemons on this machine (root)",
        description="A development Slurm cluster on this machine: munged, MariaDB, slurmdbd, "
        "slurmctld, four slurmd nodes (partitions cpu and gpu), an sshd login node (or several "
        "behind one name) and, on "
        "request, login sites with a one-time code, with certificates and behind a bastion.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        default=None,
        help=f"directory for all files of the cluster (env {STATE_DIR_ENV}; default {DEFAULT_STATE_DIR})",
    )
    common.add_argument(
        "--ssh-port", type=int, default=None, help=f"sshd port on 127.0.0.1 (env {SSH_PORT_ENV})"
    )
    common.add_argument(
        "--ssh-listen",
        default=None,
        help=f"address sshd binds (env {SSH_LISTEN_ENV}; default 127.0.0.1)",
    )
    common.add_argument("--user", default=None, help=f"non-root submitter account (env {USER_ENV})")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "up", parents=[common], help="install what is missing and start what is not running"
    )
    up.add_argument(
        "--login-sites",
        type=_login_sites,
        default=None,
        metavar="SITES",
        help=f"extra login sites to run, comma-separated from {','.join(LOGIN_SITES)}, or "
        "all, or none: otp asks for a key and a one-time code (port ssh-port+1), cert takes "
        "only certificates of the cluster's CA (+2), bastion is a jump host to the login "
        f"node (+3). Env {LOGIN_SITES_ENV}; default: what the last up ran, else none",
    )
    up.add_argument(
        "--login-nodes",
        type=int,
        choices=range(1, MAX_LOGIN_NODES + 1),
        default=None,
        metavar="N",
        help="login nodes behind the SSH port: 1 is the login node 'login'; 2 or more run "
        "login1, login2, ... (own hostname, /tmp and process table, shared /home) and the "
        "SSH port sends each connection to the next one in turn, like a site's alias. "
        f"Env {LOGIN_NODES_ENV}; default: what the last up ran, else 1",
    )
    up.add_argument(
        "--slurm-release",
        default=None,
        metavar="RELEASE",
        help=f"Slurm release of the daemons, the login node and the client commands: "
        f"{', '.join(SUITES)} or native (the machine's own packages). Another release than "
        "the machine's runs from a Debian root of the suite that packages it, built once "
        f"into /var/cache/dagster-slurm/roots. Env {RELEASE_ENV}; default: what the last "
        "up ran, else native",
    )
    up.set_defaults(handler=_up)
    down = actions.add_parser(
        "down", parents=[common], help="cancel all jobs and stop the cluster's daemons"
    )
    down.add_argument("--purge", action="store_true", help="also remove the state directory")
    down.set_defaults(handler=_down)
    status = actions.add_parser(
        "status", parents=[common], help="show the daemons; exit 1 unless all run"
    )
    status.set_defaults(handler=_status)
    env = actions.add_parser(
        "env", parents=[common], help="print export lines pointing clients at the cluster"
    )
    env.set_defaults(handler=_env)
    _add_site_actions(actions, common)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: dagster-slurm dev-cluster ...")
