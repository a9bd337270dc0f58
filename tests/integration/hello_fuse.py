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


class Hello(pyfuse3.Operations):
    async def getattr(self, inode, ctx=None):
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.st_uid, attr.st_gid = os.getuid(), os.getgid()
        if inode == pyfuse3.ROOT_INODE:
            attr.st_mode, attr.st_size = stat.S_IFDIR | 0o755, 0
        elif inode == pyfuse3.ROOT_INODE + 1:
            attr.st_mode, attr.st_size = stat.S_IFREG | 0o444, len(CONTENT)
        else:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return attr

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


def main():
    pyfuse3.init(Hello(), sys.argv[1], {"fsname=delvefs-hello"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main()
