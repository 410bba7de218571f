"""The machine's shared login: ``dagster-slurm login``, ``login --status`` and ``logout``.

A person runs ``dagster-slurm login`` once per machine and answers whatever the site asks
(password, one-time code, key passphrase) at OpenSSH's own prompt; every process of the
same OS user then runs its commands through that connection
(:mod:`dagster_slurm.transport.openssh`, chosen by :mod:`dagster_slurm.transport.choice`).
"""
