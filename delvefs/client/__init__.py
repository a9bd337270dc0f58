"""The per-user client, in three rooms:

- ``mount``: the mount process — its composition root (``composition``), daemon, settings
  and options, the FUSE adapter (``fuse_adapter``: the only module that imports pyfuse3),
  passthrough, the protocol-free file system core (``fs``), the local data cache and its
  journal (``cache``), async S3 for the core (``s3async``), its control channel, metrics
  and reports;
- ``handler``: the one client of the event handler's HTTP API (``api``), its requests
  without I/O (``endpoints``) and the proofs of S3 list rights (``proofs``);
- ``commands``: the commands a user runs beside a mount (``mount``/``umount``/``sync``,
  ``status``, ``reload``, ``watch`` and work-queue group members, ``shards``).

Arrows go one way: ``commands`` use ``mount`` (its control channel, settings) and
``handler``; ``mount`` uses ``handler``; ``handler`` uses neither.
"""
