"""The protocol-free file system core of the DelveFS client.

``core``        the FileSystem: the one object the adapter and the tests use; its
                operations live in the modules below, one per concern
``views``       views, lazy listings and delta refreshes, the views' matcher
``tree``        tree edits (never awaiting) and the overlay of local changes
``attributes``  lookup, getattr, access, forget, opendir / readdir, statfs
``reads``       handles and reads
``writes``      the write path: dirty files, uploads and retries, recovery, shutdown
``dirty``       the dirty-file state machine and its journal records
``namespace``   unlink, mkdir, rmdir, rename
``xattrs``      tags, metadata and facts as extended attributes
``inodes``      inode table, directory tree, names (tree/flat layouts), readdir snapshots

Nothing here imports pyfuse3: ``delvefs.client.fuse_adapter`` turns FUSE requests into calls
on :class:`delvefs.client.fs.core.FileSystem`, and tests drive the same object directly.
S3 is reached through ``delvefs.client.s3async``, cached bytes through
``delvefs.client.datacache``; errors and their errnos are ``delvefs.client.errors``.
"""
