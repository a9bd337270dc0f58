"""A minimal writable pyfuse3 file system (flat, in memory) that answers fallocate and
copy_file_range and records every such request, with the handle ``open``/``create``
gave, as a JSON line in LOG: the proof that the binding (contrib/pyfuse3) delivers them.

Run: python posix_ops_fuse.py MOUNTPOINT LOG  (stays in the foreground until unmounted)

fallocate: mode 0 and ZERO_RANGE extend the file with zeros, PUNCH_HOLE and ZERO_RANGE
zero their range, KEEP_SIZE keeps the size; other modes are refused with EOPNOTSUPP.
copy_file_range copies in memory, except to a file whose name starts with ``fallback``:
that is refused with EOPNOTSUPP, which makes the kernel copy by read and write instead.
"""
import errno
import itertools
import json
import os
import stat
import sys

import pyfuse3

from hello_fuse import attributes, serve  # this file runs as a script beside it

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
REFUSED_COPY_PREFIX = b"fallback"


class File:
    def __init__(self, ino: int, name: bytes):
        self.ino, self.name, self.data = ino, name, bytearray()


class PosixOps(pyfuse3.Operations):
    def __init__(self, log_path: str):
        super().__init__()
        self.log_path = log_path
        self.files: dict[int, File] = {}  # inode -> file
        self.inodes = itertools.count(pyfuse3.ROOT_INODE + 1)
        # handles differ from inodes, so the log shows which one each request carried
        self.handles = itertools.count(1000)
        self.open_files: dict[int, File] = {}  # handle -> file

    def record(self, **request) -> None:
        with open(self.log_path, "a") as log:
            log.write(json.dumps(request) + "\n")

    def by_name(self, name: bytes) -> File | None:
        return next((f for f in self.files.values() if f.name == name), None)

    def new_handle(self, file: File) -> pyfuse3.FileInfo:
        fh = next(self.handles)
        self.open_files[fh] = file
        self.record(op="open", name=file.name.decode(), inode=file.ino, fh=fh)
        return pyfuse3.FileInfo(fh=fh)

    async def getattr(self, inode, ctx=None):
        if inode == pyfuse3.ROOT_INODE:
            return attributes(inode, stat.S_IFDIR | 0o755, 0)
        if inode in self.files:
            return attributes(inode, stat.S_IFREG | 0o644, len(self.files[inode].data))
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def lookup(self, parent_inode, name, ctx=None):
        file = self.by_name(name) if parent_inode == pyfuse3.ROOT_INODE else None
        if file is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self.getattr(file.ino)

    async def setattr(self, inode, attr, fields, fh, ctx):
        if fields.update_size:
            data = self.files[inode].data
            del data[attr.st_size:]
            data.extend(bytes(attr.st_size - len(data)))
        return await self.getattr(inode)

    async def opendir(self, inode, ctx):
        return inode

    async def readdir(self, fh, start_id, token):
        for file in list(self.files.values()):
            if file.ino > start_id and not pyfuse3.readdir_reply(
                    token, file.name, await self.getattr(file.ino), file.ino):
                return

    async def create(self, parent_inode, name, mode, flags, ctx):
        file = File(next(self.inodes), name)
        self.files[file.ino] = file
        return self.new_handle(file), await self.getattr(file.ino)

    async def open(self, inode, flags, ctx):
        if flags & os.O_TRUNC:  # pyfuse3 asks for atomic O_TRUNC: no setattr comes
            del self.files[inode].data[:]
        return self.new_handle(self.files[inode])

    async def read(self, fh, off, size):
        return bytes(self.open_files[fh].data[off:off + size])

    async def write(self, fh, off, buf):
        data = self.open_files[fh].data
        data.extend(bytes(max(0, off - len(data))))
        data[off:off + len(buf)] = buf
        return len(buf)

    async def flush(self, fh):
        pass

    async def release(self, fh):
        del self.open_files[fh]

    async def unlink(self, parent_inode, name, ctx):
        file = self.by_name(name)
        if file is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        del self.files[file.ino]

    async def fallocate(self, inode, fh, mode, offset, length):
        self.record(op="fallocate", inode=inode, fh=fh, mode=mode, offset=offset, length=length)
        if mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        data = self.open_files[fh].data
        end = offset + length
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            inside = min(end, len(data))
            data[offset:inside] = bytes(max(0, inside - offset))
        if not mode & FALLOC_FL_KEEP_SIZE and end > len(data):
            data.extend(bytes(end - len(data)))

    async def copy_file_range(self, inode_in, fh_in, off_in, inode_out, fh_out, off_out,
                              length, flags):
        self.record(op="copy_file_range", inode_in=inode_in, fh_in=fh_in, off_in=off_in,
                    inode_out=inode_out, fh_out=fh_out, off_out=off_out, length=length,
                    flags=flags)
        target = self.open_files[fh_out]
        if target.name.startswith(REFUSED_COPY_PREFIX):
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        chunk = self.open_files[fh_in].data[off_in:off_in + length]
        return await self.write(fh_out, off_out, chunk)


if __name__ == "__main__":
    serve(PosixOps(sys.argv[2]), sys.argv[1], "delvefs-posix-ops")
