"""The per-user FUSE client: ``mount`` (composition root), ``fuse_adapter`` (the only
module that imports pyfuse3), the protocol-free file system core in ``fs``, the local
data cache (``datacache``), async S3 for the core (``s3async``), the handler API client
(``handler_api``) and ``watch``."""
