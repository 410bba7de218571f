"""The payload's environment on the cluster: probing it, where it lives, building it there.

Owns what runs against the login node or describes its side: the cluster's Python platform
and the probe program sent to it (:mod:`.platform`, :mod:`.remote_probe`), the layout of
``<base>/envs`` and the install commands, with the :class:`~.remote.Recipe` a packer hands
over (:mod:`.remote`), the shared wheel store program (:mod:`.remote_wheels`), one build
by the holder of the build lease (:mod:`.builder`) and the store of that lease
(:mod:`.lease_store`).

:mod:`.remote_probe` and :mod:`.remote_wheels` are stdlib-only programs whose text is sent
to the cluster; they are read as package resources of this package.
"""
