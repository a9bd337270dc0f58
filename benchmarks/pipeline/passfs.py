"""The floor of the pipeline benchmark (benchmarks/bench_pipeline.py): a pyfuse3 + trio file
system that passes every request on to a local directory — the least a file system that a
real workflow can run on must do (benchmarks/floorfs.py keeps no bytes: its reads are zeros,
so bowtie2 and samtools cannot run on it). It is mounted and served as floorfs.py is, i.e.
as a DelveFS mount is (the FUSE options, request loop, read-ahead and collector policy of
``delvefs.client.mount.fuse_adapter``: floorfs.serve), with ``--writeback`` the kernel's writeback
cache as an eager mount. What a workflow costs on it beyond the local disk is what the
kernel, pyfuse3, trio and this machine cost; DelveFS's own cost is the rest.

    python -m benchmarks.pipeline.passfs SOURCE MOUNTPOINT [--writeback] [--timeout 300]

Prints ``ready`` on stdout once it answers requests, serves until unmounted
(``fusermount3 -u``). Every call is the plain system call on SOURCE's file, run in the
request loop (no threads: the floor does the least). Inode numbers are SOURCE's (plus one;
SOURCE itself is the root); hard links are not offered.
"""
from __future__ import annotations

import argparse
import errno
import os
import stat
import sys

import pyfuse3
import trio

from benchmarks.floorfs import NoXattrs, serve
from delvefs.client.mount import fuse_adapter


def _oserror(fn):
    """An OSError of the call as the FUSE error of its errno."""
    async def wrapper(*a, **kw):
        try:
            return await fn(*a, **kw)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
    wrapper.__name__ = fn.__name__
    return wrapper


class Pass(NoXattrs, pyfuse3.Operations):  # (extended attributes: none, as the floor)
    supports_dot_lookup = True

    def __init__(self, source: str, timeout: float, writeback: bool):
        super().__init__()
        self.timeout = timeout
        self.enable_writeback_cache = writeback
        self.writeback = writeback
        self.paths = {pyfuse3.ROOT_INODE: os.path.abspath(source)}  # FUSE inode -> path
        self.listings: dict[int, list] = {}
        self.next_fh = 1

    # --- inodes and paths

    def path(self, ino: int) -> str:
        try:
            return self.paths[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def ino_of(self, path: str, st: os.stat_result) -> int:
        if path == self.paths[pyfuse3.ROOT_INODE]:
            return pyfuse3.ROOT_INODE
        ino = st.st_ino + 1  # never 1: no file has inode 0
        self.paths[ino] = path
        return ino

    def attrs(self, path: str, st: os.stat_result) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = self.ino_of(path, st)
        a.entry_timeout = a.attr_timeout = self.timeout
        for field in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size", "st_blksize",
                      "st_blocks", "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
            setattr(a, field, getattr(st, field))
        return a

    def child(self, parent_ino: int, name: bytes) -> str:
        return os.path.join(self.path(parent_ino), os.fsdecode(name))

    def moved(self, old: str, new: str) -> None:
        """Paths below ``old`` are below ``new`` now."""
        for ino, p in list(self.paths.items()):
            if p == old or p.startswith(old + "/"):
                self.paths[ino] = new + p[len(old):]

    # --- names

    @_oserror
    async def lookup(self, parent_inode, name, ctx=None):
        parent = self.path(parent_inode)
        if name == b".":
            path = parent
        elif name == b"..":
            path = parent if parent_inode == pyfuse3.ROOT_INODE else os.path.dirname(parent)
        else:
            path = os.path.join(parent, os.fsdecode(name))
        try:
            return self.attrs(path, os.lstat(path))
        except FileNotFoundError:
            a = pyfuse3.EntryAttributes()
            a.st_ino = 0  # a negative entry, cached by the kernel (as the floor's)
            a.entry_timeout = self.timeout
            return a

    async def forget(self, inode_list):
        pass

    @_oserror
    async def getattr(self, inode, ctx=None):
        path = self.path(inode)
        return self.attrs(path, os.lstat(path))

    @_oserror
    async def setattr(self, inode, attr, fields, fh, ctx):
        path = self.path(inode)
        if fields.update_size:
            if fh is not None:
                os.ftruncate(fh, attr.st_size)
            else:
                os.truncate(path, attr.st_size)
        if fields.update_mode:
            os.chmod(path, stat.S_IMODE(attr.st_mode), follow_symlinks=False)
        if fields.update_uid or fields.update_gid:
            os.chown(path, attr.st_uid if fields.update_uid else -1, attr.st_gid if fields.update_gid else -1,
                     follow_symlinks=False)
        if fields.update_atime or fields.update_mtime:
            st = os.lstat(path)
            os.utime(path, ns=(attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                               attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns),
                     follow_symlinks=False)
        return self.attrs(path, os.lstat(path))

    async def access(self, inode, mode, ctx):
        return True

    @_oserror
    async def statfs(self, ctx):
        v = os.statvfs(self.paths[pyfuse3.ROOT_INODE])
        s = pyfuse3.StatvfsData()
        for field in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                      "f_favail", "f_namemax"):
            setattr(s, field, getattr(v, field))
        return s

    @_oserror
    async def readlink(self, inode, ctx):
        return os.fsencode(os.readlink(self.path(inode)))

    @_oserror
    async def symlink(self, parent_inode, name, target, ctx):
        path = self.child(parent_inode, name)
        os.symlink(os.fsdecode(target), path)
        return self.attrs(path, os.lstat(path))

    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)

    # --- directories

    @_oserror
    async def mkdir(self, parent_inode, name, mode, ctx):
        path = self.child(parent_inode, name)
        os.mkdir(path, stat.S_IMODE(mode))
        return self.attrs(path, os.lstat(path))

    @_oserror
    async def rmdir(self, parent_inode, name, ctx):
        os.rmdir(self.child(parent_inode, name))

    @_oserror
    async def unlink(self, parent_inode, name, ctx):
        os.unlink(self.child(parent_inode, name))

    @_oserror
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        old, new = self.child(parent_inode_old, name_old), self.child(parent_inode_new, name_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        if flags & pyfuse3.RENAME_NOREPLACE and os.path.lexists(new):
            raise pyfuse3.FUSEError(errno.EEXIST)
        os.rename(old, new)
        self.moved(old, new)

    @_oserror
    async def opendir(self, inode, ctx):
        path = self.path(inode)
        with os.scandir(path) as it:
            entries = sorted((os.fsencode(e.name), e.path) for e in it)
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        self.listings[fh] = entries
        return fh

    async def readdir(self, fh, start_id, token):
        entries = self.listings[fh]
        for i in range(start_id, len(entries)):
            name, path = entries[i]
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not pyfuse3.readdir_reply(token, name, self.attrs(path, st), i + 1):
                break

    async def releasedir(self, fh):
        del self.listings[fh]

    # --- files

    def flags(self, flags: int) -> int:
        """With the writeback cache the kernel reads pages of files opened write-only and
        does the appending itself (as libfuse's passthrough_ll)."""
        if self.writeback:
            if flags & os.O_ACCMODE == os.O_WRONLY:
                flags = flags & ~os.O_ACCMODE | os.O_RDWR
            flags &= ~os.O_APPEND
        return flags

    @_oserror
    async def create(self, parent_inode, name, mode, flags, ctx):
        path = self.child(parent_inode, name)
        fd = os.open(path, self.flags(flags) | os.O_CREAT, stat.S_IMODE(mode))
        return pyfuse3.FileInfo(fh=fd), self.attrs(path, os.fstat(fd))

    @_oserror
    async def open(self, inode, flags, ctx):
        fd = os.open(self.path(inode), self.flags(flags) & ~os.O_CREAT)
        return pyfuse3.FileInfo(fh=fd, keep_cache=True)  # nothing changes it behind the kernel

    @_oserror
    async def read(self, fh, off, size):
        return os.pread(fh, size, off)

    @_oserror
    async def write(self, fh, off, buf):
        return os.pwrite(fh, buf, off)

    @_oserror
    async def fallocate(self, inode, fh, mode, offset, length):
        if mode:
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        os.posix_fallocate(fh, offset, length)

    async def flush(self, fh):
        pass

    @_oserror
    async def fsync(self, fh, datasync):
        (os.fdatasync if datasync else os.fsync)(fh)

    @_oserror
    async def release(self, fh):
        os.close(fh)



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("mountpoint")
    ap.add_argument("--writeback", action="store_true", help="the kernel's writeback cache (as eager mounts)")
    ap.add_argument("--timeout", type=float, default=300.0, help="entry and attribute timeout, seconds")
    args = ap.parse_args(argv)
    fs = Pass(args.source, args.timeout, args.writeback)
    options = fuse_adapter.fuse_options("passfs") - {"subtype=delvefs"} | {"subtype=passfs"}
    fuse_adapter.mount(fs, args.mountpoint, options)
    try:
        trio.run(serve, args.mountpoint)
    finally:
        fuse_adapter.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
