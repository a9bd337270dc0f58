"""The protocol-free file system core of the DelveFS client.

``inodes``  inode table, directory tree, names (tree/flat layouts), readdir snapshots
``core``    the FileSystem: views, lazy listings and delta refreshes, handles, xattrs, the
            write path (dirty files, uploads, overlay of local changes, renames, tags)
``store``   async S3 access (boto3 via delvefs.shared.s3 in worker threads)

Nothing here imports pyfuse3: ``delvefs.client.fuse_adapter`` turns FUSE requests into calls
on :class:`delvefs.client.fs.core.FileSystem`, and tests drive the same object directly.
"""
