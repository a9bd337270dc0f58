"""DelveFS: the per-user FUSE client, the ``delvefs`` command and the local service harness."""

__version__ = "0.1.0"
