"""The floor of the mount benchmarks: a pyfuse3 + trio file system that does the least a
correct file system must — an in-memory tree of names, sizes and modes; a write keeps only
the size, a read returns zeros — mounted and served the way a DelveFS mount is (the FUSE
options, request loop, read-ahead and garbage-collector policy of
``delvefs.client.mount.fuse_adapter`` and ``delvefs.client.mount.composition``; with ``--writeback``
the kernel's writeback cache, as an eager mount). What a benchmark measures on it is what
the kernel, pyfuse3, trio and this machine cost; DelveFS's own cost is the rest.

    python benchmarks/floorfs.py MOUNTPOINT [--writeback] [--timeout 300] [--state FILE]
                                 [--files DIR NAME-FORMAT COUNT SIZE ...]

Prints ``ready`` on stdout once it answers requests, serves until unmounted
(``fusermount3 -u``). ``--files many obj-{:06d}.dat 100000 100`` makes the directory
``many`` of 100,000 files of 100 bytes named like bench_mount's objects. ``--state FILE``
loads the tree from FILE at start and writes it there at exit, so that a benchmark can
remount it (a fresh mount: nothing in the kernel's caches) and find what it wrote.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
import time

import pyfuse3
import trio

from delvefs.client.mount import fuse_adapter
from delvefs.shared.quietgc import QuietGC

ZEROS = bytes(1 << 20)  # a read of up to 1 MiB (the mount's request size) is a slice of it


class Node:
    __slots__ = ("ino", "mode", "size", "children")

    def __init__(self, ino: int, mode: int, size: int = 0):
        self.ino, self.mode, self.size = ino, mode, size
        self.children: dict[bytes, Node] | None = {} if stat.S_ISDIR(mode) else None


class NoXattrs:
    """Extended attributes: none, answered as DelveFS answers the kernel's and ls's."""

    async def getxattr(self, inode, name, ctx):
        if name.startswith(b"user.") or name == b"security.capability":
            raise pyfuse3.FUSEError(errno.ENODATA)
        raise pyfuse3.FUSEError(errno.EOPNOTSUPP)

    async def listxattr(self, inode, ctx):
        return []

    async def setxattr(self, inode, name, value, ctx):
        raise pyfuse3.FUSEError(errno.EOPNOTSUPP)

    async def removexattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENODATA)


class Floor(NoXattrs, pyfuse3.Operations):
    supports_dot_lookup = True

    def __init__(self, timeout: float, writeback: bool):
        super().__init__()
        self.timeout = timeout
        self.enable_writeback_cache = writeback
        self.uid, self.gid = os.getuid(), os.getgid()
        self.mtime_ns = time.time_ns()
        # inodes are never reused and stay after an unlink: the kernel may still ask
        # for an unlinked file it holds open (forget is not tracked)
        self.inodes = {pyfuse3.ROOT_INODE: Node(pyfuse3.ROOT_INODE, stat.S_IFDIR | 0o755)}
        self.parents = {pyfuse3.ROOT_INODE: pyfuse3.ROOT_INODE}
        self.listings: dict[int, list] = {}  # opendir handle -> the entries it lists
        self.next_fh = 1

    # --- the tree

    def add(self, parent: Node, name: bytes, mode: int, size: int = 0) -> Node:
        node = Node(len(self.inodes) + pyfuse3.ROOT_INODE, mode, size)
        self.inodes[node.ino] = node
        self.parents[node.ino] = parent.ino
        parent.children[name] = node
        return node

    def node(self, ino: int) -> Node:
        try:
            return self.inodes[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def directory(self, ino: int) -> Node:
        node = self.node(ino)
        if node.children is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return node

    def child(self, parent_ino: int, name: bytes) -> Node:
        node = self.directory(parent_ino).children.get(name)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def attrs(self, node: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.entry_timeout = a.attr_timeout = self.timeout
        a.st_mode = node.mode
        a.st_nlink = 2 if node.children is not None else 1
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_size = node.size
        a.st_blksize = 1 << 20
        a.st_blocks = (node.size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.mtime_ns
        return a

    def paths(self, node: Node, prefix: str = ""):
        """(path, mode, size) of every node under ``node``, parents first."""
        for name, child in node.children.items():
            path = prefix + os.fsdecode(name)
            yield path, child.mode, child.size
            if child.children is not None:
                yield from self.paths(child, path + "/")

    def load(self, entries) -> None:
        for path, mode, size in entries:
            *dirs, name = [os.fsencode(p) for p in path.split("/")]
            parent = self.inodes[pyfuse3.ROOT_INODE]
            for d in dirs:
                parent = parent.children[d]
            self.add(parent, name, mode, size)

    def files(self, directory: str, name_format: str, count: int, size: int) -> None:
        parent = self.inodes[pyfuse3.ROOT_INODE]
        for part in directory.strip("/").split("/"):
            name = os.fsencode(part)
            parent = parent.children.get(name) or self.add(parent, name, stat.S_IFDIR | 0o755)
        for i in range(count):
            self.add(parent, os.fsencode(name_format.format(i)), stat.S_IFREG | 0o644, size)

    # --- names

    async def lookup(self, parent_inode, name, ctx=None):
        parent = self.directory(parent_inode)
        if name == b".":
            return self.attrs(parent)
        if name == b"..":
            return self.attrs(self.inodes[self.parents[parent_inode]])
        node = parent.children.get(name)
        if node is None:
            a = pyfuse3.EntryAttributes()
            a.st_ino = 0  # a negative entry, cached by the kernel like DelveFS's
            a.entry_timeout = self.timeout
            return a
        return self.attrs(node)

    async def forget(self, inode_list):
        pass

    async def getattr(self, inode, ctx=None):
        return self.attrs(self.node(inode))

    async def setattr(self, inode, attr, fields, fh, ctx):
        node = self.node(inode)
        if fields.update_size:
            node.size = attr.st_size
        if fields.update_mode:
            node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(attr.st_mode)
        return self.attrs(node)

    async def access(self, inode, mode, ctx):
        return True

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 1 << 20
        s.f_blocks = s.f_bfree = s.f_bavail = 1 << 30
        s.f_files = s.f_ffree = s.f_favail = 1 << 30
        s.f_namemax = 255
        return s

    # --- directories

    async def mkdir(self, parent_inode, name, mode, ctx):
        parent = self.directory(parent_inode)
        if name in parent.children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        return self.attrs(self.add(parent, name, stat.S_IFDIR | stat.S_IMODE(mode)))

    async def rmdir(self, parent_inode, name, ctx):
        node = self.child(parent_inode, name)
        if node.children is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if node.children:
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        del self.inodes[parent_inode].children[name]

    async def unlink(self, parent_inode, name, ctx):
        node = self.child(parent_inode, name)
        if node.children is not None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        del self.inodes[parent_inode].children[name]

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        node = self.child(parent_inode_old, name_old)
        new_parent = self.directory(parent_inode_new)
        there = new_parent.children.get(name_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        if there is not None:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise pyfuse3.FUSEError(errno.EEXIST)
            if there.children:
                raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        del self.inodes[parent_inode_old].children[name_old]
        new_parent.children[name_new] = node
        self.parents[node.ino] = parent_inode_new

    async def opendir(self, inode, ctx):
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        self.listings[fh] = list(self.directory(inode).children.items())
        return fh

    async def readdir(self, fh, start_id, token):
        entries = self.listings[fh]
        for i in range(start_id, len(entries)):
            name, node = entries[i]
            if not pyfuse3.readdir_reply(token, name, self.attrs(node), i + 1):
                break

    async def releasedir(self, fh):
        del self.listings[fh]

    # --- files

    async def create(self, parent_inode, name, mode, flags, ctx):
        parent = self.directory(parent_inode)
        node = parent.children.get(name)
        if node is None:
            node = self.add(parent, name, stat.S_IFREG | stat.S_IMODE(mode))
        elif flags & os.O_EXCL:
            raise pyfuse3.FUSEError(errno.EEXIST)
        elif flags & os.O_TRUNC:
            node.size = 0
        return pyfuse3.FileInfo(fh=node.ino), self.attrs(node)

    async def open(self, inode, flags, ctx):
        node = self.node(inode)
        if flags & os.O_TRUNC:
            node.size = 0
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)  # nothing changes it behind the kernel

    async def read(self, fh, off, size):
        n = max(0, min(size, self.inodes[fh].size - off))
        return ZEROS[:n] if n <= len(ZEROS) else bytes(n)

    async def write(self, fh, off, buf):
        node = self.inodes[fh]
        node.size = max(node.size, off + len(buf))
        return len(buf)

    async def fallocate(self, inode, fh, mode, offset, length):
        if mode:
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        node = self.node(inode)
        node.size = max(node.size, offset + length)

    async def copy_file_range(self, inode_in, fh_in, off_in, inode_out, fh_out, off_out,
                              length, flags):
        n = max(0, min(length, self.inodes[fh_in].size - off_in))
        node = self.inodes[fh_out]
        node.size = max(node.size, off_out + n)
        return n

    async def flush(self, fh):
        pass

    async def fsync(self, fh, datasync):
        pass

    async def release(self, fh):
        pass



async def serve(mountpoint: str) -> None:
    """The request loop, then (as a DelveFS mount) the read-ahead raised and the
    collector's policy; ``ready`` on stdout once a stat of the mountpoint answers."""
    quiet = QuietGC()
    async with trio.open_nursery() as nursery:
        async def loop():
            await fuse_adapter.serve()
            nursery.cancel_scope.cancel()
        nursery.start_soon(loop)
        st = await trio.to_thread.run_sync(os.stat, mountpoint)
        fuse_adapter.raise_read_ahead(st.st_dev)
        print("ready", flush=True)
        while True:
            await trio.sleep(1.0)
            quiet.tick()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mountpoint")
    ap.add_argument("--writeback", action="store_true", help="the kernel's writeback cache (as eager mounts)")
    ap.add_argument("--timeout", type=float, default=300.0, help="entry and attribute timeout, seconds")
    ap.add_argument("--state", help="load the tree from this file, write it there at exit")
    ap.add_argument("--files", nargs=4, action="append", default=[],
                    metavar=("DIR", "NAME_FORMAT", "COUNT", "SIZE"),
                    help="COUNT files of SIZE bytes named NAME_FORMAT.format(i) in DIR")
    args = ap.parse_args(argv)
    floor = Floor(args.timeout, args.writeback)
    if args.state and os.path.exists(args.state):
        with open(args.state) as f:
            floor.load(json.load(f))
    for directory, name_format, count, size in args.files:
        floor.files(directory, name_format, int(count), int(size))
    options = fuse_adapter.fuse_options("floorfs") - {"subtype=delvefs"} | {"subtype=floorfs"}
    fuse_adapter.mount(floor, args.mountpoint, options)
    try:
        trio.run(serve, args.mountpoint)
    finally:
        fuse_adapter.close(unmount=True)
    if args.state:
        with open(args.state, "w") as f:
            json.dump(list(floor.paths(floor.inodes[pyfuse3.ROOT_INODE])), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
