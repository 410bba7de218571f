"""Extra login sites: the ways real HPC sites let their users in, as real sshd instances.

Next to the login node's sshd (``sshd``, port P), ``up --login-sites`` starts:

``sshd-otp`` (port P+1)
    The login node again, asking for the submitter's key and then a time-based one-time
    code (keyboard-interactive through a PAM stack of its own with ``pam_oath``; see
    :mod:`dagster_slurm.devcluster.otp`).
``sshd-cert`` (port P+2)
    The login node again, accepting only certificates of the cluster's user CA issued to
    the submitter (:mod:`dagster_slurm.devcluster.certs`).
``sshd-bastion`` (port P+3)
    A jump host of its own (hostname ``bastion``) that accepts the submitter's key and
    forwards TCP connections to the login node's sshd ports.

The ``otp`` and ``cert`` sites run as node ``login`` (hostname, /etc/hosts and /tmp of the
login node, like ``sshd``), so a job submitted through them lands in the same cluster from
the same filesystem. Each site has its own configuration file, pid file and log file
(``LogLevel VERBOSE``: every accepted login is one line).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dagster_slurm.devcluster import otp
from dagster_slurm.devcluster.config import RenderedFile, render_template, write_if_changed
from dagster_slurm.devcluster.daemons import DaemonSpec, executable, in_node_namespace
from dagster_slurm.devcluster.layout import BASTION_NODE, LOGIN_NODE, Settings, site_daemon
from dagster_slurm.devcluster.processes import ssh_banner
from dagster_slurm.devcluster.sshd import accepts_option, ensure_keypair


@dataclass(frozen=True)
class LoginSite:
    """One extra login site: its ``name`` (``otp``, ``cert``, ``bastion``) and the node
    (hostname) its sshd runs as."""

    name: str
    node: str

    @property
    def daemon(self) -> str:
        """Name of the site's sshd in the pid records and ``status``."""
        return site_daemon(self.name)

    @property
    def template(self) -> str:
        return f"sshd_config.{self.name}"


SITES: dict[str, LoginSite] = {
    "otp": LoginSite("otp", LOGIN_NODE),
    "cert": LoginSite("cert", LOGIN_NODE),
    "bastion": LoginSite("bastion", BASTION_NODE),
}

#: Kernel command names a site's running sshd may have, by daemon name: the ``otp`` site's
#: sshd runs under its PAM service's name when the installed sshd lacks PAMServiceName.
SITE_COMMS: dict[str, tuple[str, ...]] = {
    site.daemon: ("sshd", otp.PAM_SERVICE[:15]) if site.name == "otp" else ("sshd",)
    for site in SITES.values()
}


#: Turns off OpenSSH's per-source penalties (9.8 and later): every client of these sites
#: comes from the same address, and the refused logins that tests make on purpose would
#: otherwise lock all of them out for a while.
NO_PENALTIES = "PerSourcePenalties no"


@dataclass(frozen=True)
class SitePlan:
    """What the installed sshd accepts: ``PAMServiceName`` (else the ``otp`` site's sshd
    runs through a link named after the PAM service) and ``PerSourcePenalties``."""

    pam_service_option: bool = True
    penalties_option: bool = True


def site_nodes() -> list[str]:
    """Hostnames the sites run as that are not compute nodes (they need a /tmp each)."""
    return sorted({site.node for site in SITES.values()})


def _pam_service_line(plan: SitePlan) -> str:
    if plan.pam_service_option:
        return f"PAMServiceName {otp.PAM_SERVICE}"
    return (
        f"# PAM service {otp.PAM_SERVICE}: this sshd has no PAMServiceName and uses its "
        "program name, a link of that name"
    )


def render_site_config(settings: Settings, name: str, plan: SitePlan) -> str:
    """Text of the sshd_config of site ``name``."""
    paths = settings.paths
    site = SITES[name]
    values: dict[str, object] = {
        "penalties": NO_PENALTIES if plan.penalties_option
        else "# (this sshd has no per-source penalties)",
        "port": settings.site_port(name),
        "listen": settings.ssh_listen,
        "host_key": paths.host_key,
        "pid_file": paths.pid_file(site.daemon),
        "user": settings.user,
        "slurm_conf": paths.slurm_conf,
    }
    if name == "otp":
        values["pam_service"] = _pam_service_line(plan)
    elif name == "cert":
        values["user_ca"] = paths.user_ca_key.with_suffix(".pub")
    elif name == "bastion":
        logins = [settings.ssh_port, *(settings.site_port(s) for s in ("otp", "cert"))]
        values["permit_open"] = " ".join(f"{settings.ssh_host}:{port}" for port in logins)
    return render_template(site.template, values)


def render_pam_service(settings: Settings) -> str:
    """Text of the ``otp`` site's PAM service file (``/etc/pam.d/dagster-slurm-otp``)."""
    return render_template(
        "pam_otp",
        {"state_dir": settings.state_dir, "usersfile": settings.paths.otp_users,
         "digits": otp.DIGITS},
    )


def render_site_files(settings: Settings, plan: SitePlan) -> list[RenderedFile]:
    """The configuration files of the chosen sites (and the PAM service of ``otp``)."""
    paths = settings.paths
    files = [
        RenderedFile(paths.site_sshd_config(name), render_site_config(settings, name, plan))
        for name in settings.login_sites
    ]
    if "otp" in settings.login_sites:
        files.append(RenderedFile(otp.PAM_DIR / otp.PAM_SERVICE, render_pam_service(settings)))
    return files


def prepare_sites(settings: Settings) -> tuple[SitePlan, list[str]]:
    """Keys, secrets and configuration files of the chosen sites; returns how they run and
    the names of the files rewritten. Needs the host key (``sshd.ensure_keys``)."""
    paths = settings.paths
    plan = SitePlan()
    sshd = executable("sshd")
    if settings.login_sites:
        plan = SitePlan(penalties_option=accepts_option(sshd, paths.host_key, NO_PENALTIES))
    if "otp" in settings.login_sites:
        otp.ensure_secret(paths, settings.user)
        by_option = accepts_option(sshd, paths.host_key, f"PAMServiceName {otp.PAM_SERVICE}")
        plan = SitePlan(pam_service_option=by_option, penalties_option=plan.penalties_option)
        if not plan.pam_service_option:
            otp.program_link(paths, sshd)
    if "cert" in settings.login_sites:
        ensure_keypair(paths.user_ca_key, "dagster-slurm-dev-user-ca")
        ensure_keypair(paths.cert_client_key, "dagster-slurm-dev-cert-client")
    changed = [
        f.path.name
        for f in render_site_files(settings, plan)
        if write_if_changed(f.path, f.text, f.mode)
    ]
    return plan, changed


def _program(settings: Settings, name: str, plan: SitePlan) -> str:
    if name == "otp" and not plan.pam_service_option:
        return str(settings.paths.programs / otp.PAM_SERVICE)
    return executable("sshd")


def site_spec(settings: Settings, name: str, plan: SitePlan) -> DaemonSpec:
    """How to run and check the sshd of site ``name``."""
    paths = settings.paths
    site = SITES[name]
    program = _program(settings, name, plan)
    log = paths.log_file(site.daemon)
    config_files: tuple[Path, ...] = (
        paths.site_sshd_config(name), paths.host_key, paths.node_hosts,
    )
    if name == "cert":
        config_files += (paths.user_ca_key.with_suffix(".pub"),)
    host, port = settings.ssh_host, settings.site_port(name)
    return DaemonSpec(
        name=site.daemon,
        comm=Path(program).name[:15],
        argv=in_node_namespace(
            settings, site.node, (program, "-f", str(paths.site_sshd_config(name)), "-E", str(log))
        ),
        pid_file=paths.pid_file(site.daemon),
        logs=(log, paths.output_file(site.daemon)),
        config_files=config_files,
        ready=lambda: ssh_banner(host, port).startswith("SSH-"),
        ready_timeout=10.0,
        ports=((host, port),),
    )


def site_specs(settings: Settings, plan: SitePlan) -> list[DaemonSpec]:
    """The chosen sites' daemons in start order (after the login node's sshd)."""
    return [site_spec(settings, name, plan) for name in settings.login_sites]


def remove_pam_service(settings: Settings) -> bool:
    """Remove the ``otp`` site's PAM service file if it was written for this state
    directory (``down --purge``); True when removed."""
    path = otp.PAM_DIR / otp.PAM_SERVICE
    try:
        text = path.read_text()
    except OSError:
        return False
    if text != render_pam_service(settings):
        return False
    path.unlink()
    return True
