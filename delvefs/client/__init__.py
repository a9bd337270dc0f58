"""The per-user FUSE client: the commands (``mount``), the daemon (``daemon``), a mount's
settings (``settings``, read from ``options``), its composition root (``composition``),
``fuse_adapter`` (the only module that imports pyfuse3), the protocol-free file system core
in ``fs``, the local data cache (``datacache``), async S3 for the core (``s3async``), the
handler API client (``handler_api``) and ``watch``."""
