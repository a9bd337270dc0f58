"""A minimal pyfuse3 file system (one read-only file) used by the foundation test
to prove that this machine can make and remove kernel FUSE mounts.

Run: python hello_fuse.py MOUNTPOINT  (stays in the foreground until unmounted)
"""
import errno
import os
import stat
import sys

import pyfuse3
import trio

CONTENT = b"hello from a kernel FUSE mount\n"
NAME = b"hello.txt"


def attributes(inode: int, mode: int, size: int) -> pyfuse3.EntryAttributes:
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = inode
    attr.st_uid, attr.st_gid = os.getuid(), os.getgid()
    attr.st_mode, attr.st_size = mode, size
    attr.st_blocks = (size + 511) // 512  # no blocks would look like a sparse file to cp
    return attr


class Hello(pyfuse3.Operations):
    async def getattr(self, inode, ctx=None):
        if inode == pyfuse3.ROOT_INODE:
            return attributes(inode, stat.S_IFDIR | 0o755, 0)
        if inode == pyfuse3.ROOT_INODE + 1:
            return attributes(inode, stat.S_IFREG | 0o444, len(CONTENT))
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode != pyfuse3.ROOT_INODE or name != NAME:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self.getattr(pyfuse3.ROOT_INODE + 1)

    async def opendir(self, inode, ctx):
        return inode

    async def readdir(self, fh, start_id, token):
        if start_id == 0:
            pyfuse3.readdir_reply(token, NAME, await self.getattr(pyfuse3.ROOT_INODE + 1), 1)

    async def open(self, inode, flags, ctx):
        return pyfuse3.FileInfo(fh=inode)

    async def read(self, fh, off, size):
        return CONTENT[off:off + size]


def serve(operations: pyfuse3.Operations, mountpoint: str, fsname: str) -> None:
    """Mount ``operations`` at ``mountpoint`` and answer requests until unmounted."""
    pyfuse3.init(operations, mountpoint, {f"fsname={fsname}"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


def main():
    serve(Hello(), sys.argv[1], "delvefs-hello")


if __name__ == "__main__":
    main()
