"""The FUSE side of a mount: the only module that imports pyfuse3.

``Adapter`` turns pyfuse3's low-level requests into calls on the protocol-free core
(:class:`delvefs.client.mount.fs.core.FileSystem`): names bytes -> str, nodes -> EntryAttributes,
:class:`FsError` -> ``FUSEError`` (the errno table: ``delvefs.client.mount.errors``). No exception
escapes a handler: an unexpected one is logged with its traceback and answered with EIO.

Kernel caches: entries and attributes are cached for the view's ``ttl``; a name missing
from a fresh listing is answered with a *negative entry* (inode 0) cached as long. In eager
mode the kernel's writeback cache is on (see ``Adapter.__init__``).
fallocate and copy_file_range reach the mount only through pyfuse3 built with
contrib/pyfuse3's patch (scripts/bootstrap.sh installs it; ``POSIX_OPS`` tells); with
PyPI's pyfuse3 the kernel refuses fallocate(2) and copies by read and write.
With that pyfuse3 the mount also negotiates KILLPRIV_V2 (custom I/O adds the flag to
libfuse's INIT reply, ``CUSTOM_IO`` tells): the kernel then leaves clearing setuid/setgid
bits on write, truncate and chown to the mount — DelveFS shows none (docs/SEMANTICS.md) —
and no longer asks ``getxattr("security.capability")`` before each write; pyfuse3
answers the remaining ones itself, without calling ``getxattr`` here.
With that pyfuse3 and Linux >= 6.9 the mount also uses FUSE passthrough (``PASSTHROUGH``
tells whether pyfuse3 can; ``delvefs.client.mount.passthrough`` decides per open): an open of a
file whose whole object is cached is answered with a backing id, and the kernel reads it
from the cache file without asking the mount.
``Notifier`` delivers the core's invalidations (``invalidate_entry`` /
``invalidate_inode``) from its own task, one worker thread at a time: they must never
run inside a request handler, which may hold the very inode lock they wait for.
"""
from __future__ import annotations

import errno
import functools
import logging
import math
import os
from time import perf_counter

import pyfuse3
import trio

from .errors import FsError, errno_of_oserror
from .fs.core import FileSystem
from .passthrough import Passthrough, has_cap_sys_admin

log = logging.getLogger(__name__)


# `delvefs mount --debug` (log level debug): one log line per FUSE request; set by ``mount``
trace_requests = False

# pyfuse3 delivers fallocate and copy_file_range (contrib/pyfuse3)
POSIX_OPS = all(hasattr(pyfuse3.Operations, op) for op in ("fallocate", "copy_file_range"))
# pyfuse3 reads /dev/fuse through its custom I/O (contrib/pyfuse3): KILLPRIV negotiated
CUSTOM_IO = hasattr(pyfuse3, "killpriv_flags")
# pyfuse3 negotiates FUSE passthrough and completes open replies with a backing id
# (contrib/pyfuse3's passthrough.patch)
PASSTHROUGH = hasattr(pyfuse3, "backing_open")


def _guard(fn):
    """Map FsError to its errno, an OSError (cache file I/O) to its own, and anything
    unexpected to EIO with a log line. With metrics on, time the request (by operation,
    whether it failed: ``Adapter.request_times``)."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self, *args):
        if trace_requests:
            # write data is not logged, only its length
            log.debug("%s%r", name, args if name != "write" else (args[0], args[1], len(args[2])))
        times = self.request_times
        started = perf_counter() if times is not None else 0.0
        failed = True
        try:
            answer = await fn(self, *args)
            failed = False
            return answer
        except pyfuse3.FUSEError:
            raise
        except FsError as exc:
            if not exc.logged and exc.errno not in (errno.ENOENT, errno.ENODATA, errno.EROFS,
                                                    errno.EOPNOTSUPP, errno.EEXIST, errno.ENOTEMPTY):
                log.info("%s%r: %s", fn.__name__, args[:2], exc)
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            log.warning("%s%r: %s", fn.__name__, args[:2], exc)
            raise pyfuse3.FUSEError(errno_of_oserror(exc)) from None
        except Exception:  # noqa: BLE001 — the contract: never let one escape
            log.exception("unexpected error in %s%r", fn.__name__, args[:2])
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            if times is not None:
                times.observe(name, perf_counter() - started, failed)
    return wrapper


class Notifier:
    """Queue of kernel cache invalidations, delivered by ``run`` in a worker thread."""

    def __init__(self):
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self.delivered = 0

    def entry(self, parent_ino: int, name: str) -> None:
        self._send.send_nowait(("e", parent_ino, os.fsencode(name)))

    def inode(self, ino: int) -> None:
        self._send.send_nowait(("i", ino, None))

    @staticmethod
    def _deliver(batch) -> None:
        for kind, ino, name in batch:
            try:
                if kind == "e":
                    pyfuse3.invalidate_entry(ino, name)
                else:
                    pyfuse3.invalidate_inode(ino, attr_only=False)
            except (FileNotFoundError, OSError):
                pass  # the kernel did not have it cached: nothing to drop

    async def run(self) -> None:
        async with self._recv:
            async for item in self._recv:
                batch = [item]
                while True:
                    try:
                        batch.append(self._recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                await trio.to_thread.run_sync(self._deliver, batch, abandon_on_cancel=True)
                self.delivered += len(batch)


class Adapter(pyfuse3.Operations):
    supports_dot_lookup = True

    def __init__(self, core: FileSystem, request_times=None):
        super().__init__()
        self.core = core
        # FUSE requests timed by operation (delvefs.shared.histogram.Timings); None: the
        # mount exports no metrics
        self.request_times = request_times
        # Eager mode: the kernel's writeback cache (writes reach the mount coalesced, at
        # close, fsync or the kernel's writeback: one request instead of one per write(2)).
        # The kernel then keeps the sizes and mtimes of the files it holds, so the core
        # gives a file others changed to another size a new inode
        # (``Tree.object_changed``). Strict mode keeps every write(2) in the cache
        # directory at once (a killed mount loses nothing written).
        self.enable_writeback_cache = core.writeback_cache
        # FUSE passthrough (delvefs.client.mount.passthrough); the kernel does not combine it
        # with the writeback cache; ``core.passthrough``: for `delvefs status`
        self.passthrough = _passthrough(core)
        attach = getattr(core, "attach_passthrough", None)  # (not on a stand-in core of a test)
        if attach is not None:
            attach(self.passthrough)
        self.enable_passthrough = self.passthrough.wanted

    def _attrs(self, node) -> pyfuse3.EntryAttributes:
        core = self.core
        if node.ino in self.passthrough.writing:
            # the kernel writes it itself (passthrough): its size and mtime are the file's
            try:
                self.passthrough.sync(node.ino)
            except (FsError, OSError) as exc:
                log.warning("passthrough file of inode %d: %s", node.ino, exc)
        mode, nlink, size, mtime_ns, timeout = core.stat(node)
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        a.entry_timeout = timeout
        a.attr_timeout = timeout
        a.st_mode = mode
        a.st_nlink = nlink
        a.st_uid = core.uid
        a.st_gid = core.gid
        a.st_rdev = 0
        a.st_size = size
        a.st_blksize = 1 << 20
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = mtime_ns
        a.st_mtime_ns = mtime_ns
        a.st_ctime_ns = mtime_ns
        return a

    @_guard
    async def lookup(self, parent_inode, name, ctx=None):
        node = await self.core.lookup(parent_inode, os.fsdecode(name))
        if node is None:
            parent = self.core.table.get(parent_inode)
            a = pyfuse3.EntryAttributes()
            a.st_ino = 0  # a negative entry, cached by the kernel for entry_timeout
            a.entry_timeout = self.core.timeout(parent) if parent is not None else 0
            return a
        return self._attrs(node)

    async def forget(self, inode_list):
        try:
            self.core.forget(inode_list)
        except Exception:  # noqa: BLE001
            log.exception("forget")

    @_guard
    async def getattr(self, inode, ctx=None):
        return self._attrs(await self.core.getattr(inode))

    @_guard
    async def setattr(self, inode, attr, fields, fh, ctx):
        # mode, owner and times are accepted without being stored (cp -p, rsync -a work)
        size = attr.st_size if fields.update_size else None
        if size is not None:
            self.passthrough.sync(inode)
        return self._attrs(await self.core.setattr(inode, size=size, fh=fh))

    @_guard
    async def opendir(self, inode, ctx):
        return await self.core.opendir(inode)

    @_guard
    async def readdir(self, fh, start_id, token):
        attrs = self._attrs
        reply = pyfuse3.readdir_reply
        fsencode = os.fsencode
        await self.core.readdir(fh, start_id,
                                lambda name, node, off: reply(token, fsencode(name), attrs(node), off))

    @_guard
    async def releasedir(self, fh):
        self.core.releasedir(fh)

    @_guard
    async def open(self, inode, flags, ctx):
        if inode in self.passthrough.writing:
            self.passthrough.sync(inode)  # (an O_TRUNC open truncates what the kernel wrote)
        fh, keep = await self.core.open(inode, flags)
        # (no await between the answer and the reply: the inode's io mode is counted there)
        backing, direct = self.passthrough.answer(fh, flags)
        if backing:
            return pyfuse3.FileInfo(fh=fh, keep_cache=False, direct_io=direct, backing_id=backing)
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    @_guard
    async def read(self, fh, off, size):
        if self.passthrough.writing:
            self._sync(fh)  # (direct I/O beside a file the kernel writes)
        return await self.core.read(fh, off, size)

    @_guard
    async def release(self, fh):
        try:
            try:
                self._sync(fh)
            finally:
                await self.core.release(fh)
        finally:
            self.passthrough.released(fh)

    @_guard
    async def flush(self, fh):
        # close(2) returns flush's error (release's is ignored): the upload happens here
        self._sync(fh)
        await self.core.flush(fh)

    @_guard
    async def fsync(self, fh, datasync):
        self._sync(fh)
        await self.core.fsync(fh)

    def _sync(self, fh) -> None:
        """What the kernel wrote through passthrough into the file of ``fh``'s inode, taken
        into the core first (its size, mtime, that it changed)."""
        rec = self.passthrough.handles.get(fh)
        if rec is not None and rec[0] in self.passthrough.writing:
            self.passthrough.sync(rec[0])

    @_guard
    async def create(self, parent_inode, name, mode, flags, ctx):
        if self.passthrough.writing:
            self.passthrough.sync_all()  # (the name may be a file the kernel writes)
        fh, node = await self.core.create(parent_inode, os.fsdecode(name), flags)
        backing, direct = self.passthrough.answer(fh, flags)
        return pyfuse3.FileInfo(fh=fh, keep_cache=False, direct_io=direct, backing_id=backing), \
            self._attrs(node)

    @_guard
    async def write(self, fh, off, buf):
        if self.passthrough.writing:
            self._sync(fh)
        return await self.core.write(fh, off, buf)

    @_guard
    async def fallocate(self, inode, fh, mode, offset, length):
        # EOPNOTSUPP for a mode the core does not support reaches the caller; the kernel
        # asks again next time (ENOSYS would make it refuse every later fallocate)
        self._sync(fh)
        await self.core.fallocate(inode, fh, mode, offset, length)

    @_guard
    async def copy_file_range(self, inode_in, fh_in, off_in, inode_out, fh_out, off_out,
                              length, flags):
        # Returns the bytes copied. EOPNOTSUPP from the core: the kernel copies this range
        # itself by read and write (cp never sees it)
        if self.passthrough.writes_through(fh_out):
            # the kernel writes that file itself: a server-side copy would give the handle
            # another file, the kernel would go on writing the old one
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        self._sync(fh_in)
        return await self.core.copy_file_range(fh_in, off_in, fh_out, off_out, length, flags)

    @_guard
    async def unlink(self, parent_inode, name, ctx):
        if self.passthrough.writing:
            self.passthrough.sync_all()
        await self.core.unlink(parent_inode, os.fsdecode(name))

    @_guard
    async def rmdir(self, parent_inode, name, ctx):
        await self.core.rmdir(parent_inode, os.fsdecode(name))

    @_guard
    async def mkdir(self, parent_inode, name, mode, ctx):
        return self._attrs(await self.core.mkdir(parent_inode, os.fsdecode(name)))

    @_guard
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        if self.passthrough.writing:
            self.passthrough.sync_all()
        await self.core.rename(parent_inode_old, os.fsdecode(name_old), parent_inode_new,
                               os.fsdecode(name_new), flags)

    @_guard
    async def link(self, inode, new_parent_inode, new_name, ctx):
        self.core.refuse(f"hard link {os.fsdecode(new_name)!r}")

    @_guard
    async def symlink(self, parent_inode, name, target, ctx):
        self.core.refuse(f"symlink {os.fsdecode(name)!r}")

    @_guard
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        self.core.refuse(f"special file {os.fsdecode(name)!r}")

    @_guard
    async def getxattr(self, inode, name, ctx):
        # asked before writes, truncates and chowns unless KILLPRIV_V2 was negotiated (and
        # then answered by pyfuse3 without coming here): no file has it, answered at once
        if name == b"security.capability":
            raise pyfuse3.FUSEError(errno.ENODATA)
        return await self.core.getxattr(inode, os.fsdecode(name))

    @_guard
    async def listxattr(self, inode, ctx):
        return [os.fsencode(n) for n in await self.core.listxattr(inode)]

    @_guard
    async def setxattr(self, inode, name, value, ctx):
        if inode in self.passthrough.writing:
            self.passthrough.sync(inode)  # (tags and `user.delvefs.sync` may upload it)
        await self.core.setxattr(inode, os.fsdecode(name), value)

    @_guard
    async def removexattr(self, inode, name, ctx):
        await self.core.removexattr(inode, os.fsdecode(name))

    @_guard
    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        for k, v in self.core.statfs().items():
            setattr(s, k, v)
        return s

    @_guard
    async def access(self, inode, mode, ctx):
        self.core.access(inode, mode)  # FsError (EACCES, EROFS) when refused
        return True


def passthrough_unavailable() -> str:
    """Why this process cannot use FUSE passthrough at all ("" when it can)."""
    if not PASSTHROUGH:
        return "pyfuse3 without passthrough (contrib/pyfuse3)"
    if not CUSTOM_IO or pyfuse3.custom_io_state() not in ("installed", "not mounted"):
        return "pyfuse3 without custom I/O"
    if not has_cap_sys_admin():
        return "no CAP_SYS_ADMIN (FUSE_DEV_IOC_BACKING_OPEN needs it)"
    return ""


def _passthrough(core) -> Passthrough:
    """The mount's passthrough policy: asked for unless ``-o passthrough=off``, eager mode
    (the writeback cache), a pyfuse3 without it or a process without CAP_SYS_ADMIN."""
    settings = getattr(core, "settings", None)
    mode = getattr(settings, "passthrough", "on")
    why_not = ""
    if settings is None:
        why_not = "no mount settings"
    elif mode == "off":
        why_not = "-o passthrough=off"
    elif core.writeback_cache:
        why_not = ("eager mode: the kernel's writeback cache, which the kernel does not "
                   "combine with passthrough (-o passthrough=rw replaces it)")
    else:
        why_not = passthrough_unavailable()
    if why_not or not PASSTHROUGH:
        return Passthrough(core, wanted=False, why_not=why_not)
    # writers too with -o passthrough=rw, not while parts are uploaded as they are written
    # (eager mode sends no parts while a file is written: it journals it)
    writes = mode == "rw" and not (getattr(settings, "upload_while_writing", False)
                                   and not getattr(settings, "eager", False))
    return Passthrough(core, wanted=True, state=pyfuse3.passthrough_state, writes=writes,
                       backing_open=pyfuse3.backing_open, backing_close=pyfuse3.backing_close)


def fuse_options(fsname: str = "delvefs") -> set[str]:
    # Not pyfuse3's default "default_permissions": with it the kernel re-reads the
    # directory's attributes (a GETATTR round trip) before every create and unlink after
    # the previous one changed the directory. By default the mount is the mounting user's
    # alone (no allow_other) and the core refuses writes where they are not allowed (EROFS,
    # EACCES); the kernel asks ``access`` for access(2) and chdir (docs/SEMANTICS.md,
    # "Permissions"). allow_other brings default_permissions (delvefs.client.mount.options).
    return {f"fsname={fsname}", "subtype=delvefs", "noatime"}


# sequential reads reach the mount as requests of the kernel's read-ahead size (128 KiB by
# default); 1 MiB requests (pyfuse3 negotiates up to 256 pages) cost an eighth of the
# per-request overhead: a 1 GiB read measured 7.9 s at 128 KiB, 4.5 s at 1 MiB
READ_AHEAD_KIB = 1024


def raise_read_ahead(device: int, kib: int = READ_AHEAD_KIB) -> None:
    """Set the read-ahead of the mount's backing device ``device`` (its ``st_dev``:
    ``/sys/class/bdi/<major:minor>/read_ahead_kb``) once the kernel has the file system's
    INIT answer (which lowers it to what libfuse proposed). Root only: otherwise, or when
    the kernel refuses, it stays as it is (a debug log line)."""
    path = f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(kib))
    except OSError as exc:
        log.debug("read-ahead of the mount left as it is (%s): %s", path, exc)


def log_killpriv() -> None:
    """One log line, once the kernel has the INIT answer: whether the kernel leaves
    clearing setuid/setgid bits to the mount (KILLPRIV_V2), or why not — then it asks
    ``security.capability`` before every write and clears those bits itself. And one
    for FUSE passthrough (on, or why not: ``Passthrough.resolve``)."""
    if _mounted is not None:
        _mounted.passthrough.resolve()
    if not CUSTOM_IO:
        log.info("KILLPRIV not negotiated (pyfuse3 without custom I/O: contrib/pyfuse3): "
                 "the kernel asks for security.capability before every write")
        return
    flags = pyfuse3.killpriv_flags()
    if flags & pyfuse3.HANDLE_KILLPRIV_V2:
        log.info("KILLPRIV_V2 negotiated: no security.capability request before writes")
    else:
        state = pyfuse3.custom_io_state()
        why = "the kernel did not offer it" if state == "installed" else state
        log.info("KILLPRIV_V2 not negotiated (%s): the kernel asks for security.capability "
                 "before every write", why)


# the adapter mounted by ``mount`` (its passthrough outcome is logged by ``log_killpriv``)
_mounted: Adapter | None = None


def mount(adapter: Adapter, mountpoint: str, options: set[str]) -> None:
    """Mount (synchronously): afterwards the kernel queues requests until ``serve``."""
    global trace_requests, _mounted
    _mounted = adapter
    trace_requests = log.isEnabledFor(logging.DEBUG)
    if not POSIX_OPS:
        log.info("pyfuse3 without fallocate and copy_file_range (contrib/pyfuse3): "
                 "fallocate(2) is refused, copies pass through the mount")
    pyfuse3.init(adapter, mountpoint, options)


async def serve(max_tasks: int = 64) -> None:
    """Answer requests until the file system is unmounted or ``terminate`` is called."""
    await pyfuse3.main(min_tasks=4, max_tasks=max_tasks)


def terminate() -> None:
    pyfuse3.terminate()


def close(unmount: bool = True) -> None:
    passthrough = getattr(_mounted, "passthrough", None)  # (a file system of the benchmarks has none)
    if passthrough is not None:
        passthrough.close()
    pyfuse3.close(unmount=unmount)
