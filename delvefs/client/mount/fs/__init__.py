"""The protocol-free file system core of the DelveFS client.

``core``        the FileSystem: the facade the adapter and the tests use; it builds the
                parts below and hands each the others it needs
``catalog``     the views (ViewState records), the overlay's entries, which view an
                object belongs to
``tree``        tree edits (never awaiting), the overlay of local changes, the pages the
                kernel may keep
``views``       registration, lazy listings and delta refreshes, staleness, reload
``properties``  tags and metadata of files, retagging
``deletes``     eager unlinks' DELETEs, batched
``uploads``     conditional uploads and conflicts, the background queue, recovery, sync,
                shutdown, parts sent while written (``parts``), rebuilds from server-side
                copies (``rebuild``)
``writes``      create, write, flush, fsync, truncate of dirty files
``reads``       open for reading, read, release; read-ahead
``handles``     open file and directory handles
``dirty``       the dirty-file state machine and its journal records
``namespace``   unlink, mkdir, rmdir, rename
``xattrs``      tags, metadata and facts as extended attributes
``attributes``  lookup, getattr, access, forget, opendir / readdir, statfs
``inodes``      inode table, directory tree, names (tree/flat layouts), readdir snapshots

Nothing here imports pyfuse3: ``delvefs.client.mount.fuse_adapter`` turns FUSE requests into calls
on :class:`delvefs.client.mount.fs.core.FileSystem`, and tests drive the same object directly.
S3 is reached through ``delvefs.client.mount.s3async``, cached bytes through
``delvefs.client.mount.cache.datacache``; errors and their errnos are ``delvefs.client.mount.errors``.
"""
