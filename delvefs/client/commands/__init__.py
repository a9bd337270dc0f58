"""The commands a user runs beside a mount: ``mount`` (mount, umount, sync), ``status``,
``reload``, ``watch`` with ``workgroup`` (members of a work-queue group) and ``viewdir``
(a view's directory as they see it), ``shardctl`` (``delvefs shards``)."""
