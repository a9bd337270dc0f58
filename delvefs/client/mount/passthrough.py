"""FUSE passthrough: the kernel serves ``read(2)``, ``write(2)``, ``splice`` and ``mmap`` of
an open file straight from the file in the cache directory that holds its bytes, without a
request to the mount (Linux >= 6.9, ``CONFIG_FUSE_PASSTHROUGH``; the mount needs
``CAP_SYS_ADMIN``). The mechanism is pyfuse3's as contrib/pyfuse3 builds it
(``passthrough.patch``): ``FUSE_PASSTHROUGH`` and ``max_stack_depth`` = 1 in the INIT
reply, a backing id for an open cache file (``FUSE_DEV_IOC_BACKING_OPEN`` on /dev/fuse)
and ``FOPEN_PASSTHROUGH`` with that id in the reply to an OPEN or CREATE. This module is
the policy: which opens go through, with which file, and when an id is dropped. It reads
the core's handles and cache entries and imports no pyfuse3 (the adapter,
``delvefs.client.mount.fuse_adapter``, hands it pyfuse3's functions and asks it at every open,
create and release).

Which opens. A reading handle whose version's *whole* object is in its cache file
(``entry.present`` covers it; clean, the node's ETag): the bytes are all local, and a
version's cache file never changes while it is held (a new version is a new file; a
writer of this mount takes a copy). A handle that would still need bytes from S3 (a
partly fetched object, a first read) stays on the mount's path: the kernel could not ask
for the missing blocks. Neither do opens with ``O_DIRECT`` (the backing file's alignment
rules would apply) nor eager mounts (below).

Writers (``-o passthrough=rw`` only): a handle writing a file that is whole in its own
local file — a create, an ``O_TRUNC`` open, a file written here and not uploaded yet
without a ranges log, or an object opened without ``O_TRUNC`` whose every byte is in the
cache and that is smaller than an upload part (its ranges log is dropped: the upload sends
the whole file anyway). Its journal record is written at the open (the mount will not see
the first byte); the kernel writes the file itself, and the mount takes size and mtime
from the file (``sync``, ``Writes.written_by_kernel``) whenever it needs them: before it
answers attributes of the inode, before any other request on it (an open, a create or
rename or unlink of its name, a read or write of a descriptor it serves with direct I/O)
and at flush, fsync, release, truncate and fallocate — then uploads as before. Not for a
write-in-place of an object partly cached or of a part or more (a ranges log records what
it changes, so that the upload copies the rest server-side), nor with ``DELVEFS_UPLOAD_WHILE_WRITING``. A server-side copy (``copy_file_range``) into such a
handle is refused (EOPNOTSUPP: the kernel copies by read and write), because the kernel
would go on writing the file the copy replaced.

The kernel's rules (fs/fuse/iomode.c), which this module keeps:

- *One io mode per inode.* While any file of an inode is open through the page cache
  ("cached": every open the mount answers without passthrough), an open with
  ``FOPEN_PASSTHROUGH`` fails EIO (-ETXTBSY inside the kernel); while any is open with
  passthrough, an open without it fails EIO ("FOPEN_PASSTHROUGH expected"). So an inode's
  opens are counted here (``InodeIO``) as the kernel sees them — from the reply to the
  release — and a new open follows the inode's mode: beside cached opens it is cached;
  beside passthrough opens it is passthrough too.
- *One backing file per inode.* An open with another backing id than the inode's files
  have fails EIO (-EBUSY): the id is registered once per inode and shared by all its
  passthrough opens, and dropped (``FUSE_DEV_IOC_BACKING_CLOSE``) when the last of them is
  released (the kernel lets go of the inode's backing file before it sends that RELEASE).
  An open beside passthrough ones that must not read the backing file — a writer, or a
  reader of another version (the file written here meanwhile) — gets the id *and*
  ``FOPEN_DIRECT_IO``: its reads and writes come to the mount as before (no page cache);
  only its ``mmap`` maps the backing file.
- ``FOPEN_KEEP_CACHE`` is refused with passthrough (EIO): not sent.
- The kernel opens the backing file anew for each passthrough open, with that open's
  flags and the mount's credentials, by the path of the registered file: a file the cache
  unlinks meanwhile (a new version, an eviction of the entry) stays readable through it.

While a backing id is registered its entry is held and pinned whole (``entry.pinned``): the
cache never punches evicted blocks out of a file the kernel reads by itself (the bound may
be exceeded meanwhile, as by a read larger than it). The mount does not see those reads:
the entry counts as read (its blocks the most recently used) when the id is registered and
when it is dropped, and they are not in the cache's hit counters.

The writeback cache (eager mode) and passthrough exclude each other: the kernel does not
negotiate passthrough when the INIT reply also asks for the writeback cache, and then
refuses every backing id (EPERM). Eager mounts keep the writeback cache; passthrough is off
there, with the reason in ``delvefs status``.

Falling back: without CAP_SYS_ADMIN, on an older kernel, with pyfuse3 without the patch,
with ``-o passthrough=off`` or when the kernel refuses a backing file (EPERM; ELOOP: a
cache directory on a stacked file system such as overlayfs, deeper than max_stack_depth 1
allows; EINVAL) the mount serves every read and write itself as before, says why in one
log line, and ``delvefs status`` shows it (``report``).
"""
from __future__ import annotations

import errno
import logging
import os
import time

log = logging.getLogger(__name__)

CAP_SYS_ADMIN = 21

# refusals that say passthrough will not work on this mount (or not for any cache file):
# it is turned off; others (ENOMEM, EMFILE, ...) only skip the open that met them
_SYSTEMATIC = {
    errno.EPERM: "no CAP_SYS_ADMIN, or passthrough was not negotiated",
    errno.ELOOP: "the cache directory is on a stacked file system (overlayfs?) deeper than "
                 "max_stack_depth 1 allows",
    errno.EINVAL: "the kernel rejected the backing file",
    errno.EBADF: "the kernel rejected the backing file",
    errno.ENOTTY: "the kernel has no FUSE_DEV_IOC_BACKING_OPEN",
    errno.EOPNOTSUPP: "the kernel has no FUSE passthrough",
}


def has_cap_sys_admin(status_path: str = "/proc/self/status") -> bool:
    """Whether this process has CAP_SYS_ADMIN in its effective set (needed by
    FUSE_DEV_IOC_BACKING_OPEN)."""
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


class Backing:
    """A backing id registered for one cache entry's file: the file every passthrough
    open of one inode reads."""
    __slots__ = ("id", "entry", "pin")

    def __init__(self, backing_id: int, entry):
        self.id = backing_id
        self.entry = entry
        self.pin = (0, entry.size)


class InodeIO:
    """The open files of one inode as the kernel counts them: with passthrough (all of
    them with ``backing``) or through the page cache (``cached``); ``writers``: the
    passthrough handles the kernel writes through (fh -> the file's (size, mtime, ctime)
    when the mount last took them, None: to be taken)."""
    __slots__ = ("backing", "passthrough", "cached", "writers")

    def __init__(self):
        self.backing: Backing | None = None
        self.passthrough = 0
        self.cached = 0
        self.writers: dict[int, tuple | None] = {}

# a file changed this recently may change again within the same timestamp tick unseen
# (kernels before 6.13 have no fine-grained ctime once it was queried): taken again later
_RECENT_NS = 50_000_000


class Passthrough:
    """Which opens the kernel serves from their cache file. ``wanted``: the mount asks for
    passthrough (else ``why_not`` says why not); ``state``: called until it answers
    ``'negotiated'`` or something else, pyfuse3's outcome of the INIT negotiation;
    ``backing_open(fd) -> id`` and ``backing_close(id)`` are pyfuse3's (raising OSError)."""

    def __init__(self, core, *, wanted: bool, why_not: str = "", state=None,
                 backing_open=None, backing_close=None, writes: bool = False):
        self.core = core
        self.wanted = wanted
        self.writes = writes and wanted  # writers too (-o passthrough=rw)
        self.writing: dict[int, InodeIO] = {}  # inodes the kernel writes through passthrough
        self._why_not = why_not
        self._state_fn = state
        self._backing_open = backing_open
        self._backing_close = backing_close
        self._on: bool | None = None if wanted else False  # None: INIT outcome not known yet
        self.reason = why_not  # why it is off ('' while on)
        self.logged = False
        self.inodes: dict[int, InodeIO] = {}
        self.handles: dict[int, tuple[int, bool]] = {}  # fh -> (ino, with passthrough)
        # (every open the adapter answered is counted, with passthrough or not: the kernel's
        # io mode of an inode depends on all of them)
        self.opens = 0        # opens answered with passthrough
        self.direct = 0       # ... of them with FOPEN_DIRECT_IO beside a backing file
        self.registered = 0   # backing ids registered

    # ------------------------------------------------------------ the mount's state

    @property
    def on(self) -> bool:
        if self._on is None:
            state = self._state_fn() if self._state_fn is not None else "negotiated"
            if state == "no INIT reply yet":
                return False  # asked again at the next open
            self._on = state == "negotiated"
            if not self._on:
                self.reason = f"not negotiated: {state}"
        return self._on

    def resolve(self) -> None:
        """Once the kernel has the INIT reply: one log line, whether reads and writes of
        cached files bypass the mount or why not."""
        if self.logged:
            return
        if self.on:
            log.info("FUSE passthrough on: the kernel reads files whose whole object is in "
                     "the cache directory from their cache file, without the mount%s",
                     "; and writes new and truncated files into their local file" if self.writes else "")
        elif self._on is None:
            return  # the INIT reply is still to come
        else:
            log.info("FUSE passthrough off (%s): every read and write goes through the mount",
                     self.reason)
        self.logged = True

    def _turn_off(self, why: str) -> None:
        self._on = False
        self.reason = why
        log.warning("FUSE passthrough off from now on (%s): reads and writes go through the "
                    "mount", why)
        self.logged = True

    def report(self) -> dict:
        """What ``delvefs status`` shows: on, or off and why; the files open through it."""
        on = self.on
        return {"state": "on" if on else "off", "reason": "" if on else self.reason,
                "writes": on and self.writes,
                "writing_files": sum(len(io.writers) for io in self.writing.values()),
                "open_files": sum(io.passthrough for io in self.inodes.values()),
                "backing_files": sum(io.backing is not None for io in self.inodes.values()),
                "opens": self.opens, "direct_opens": self.direct,
                "registered": self.registered}

    # ------------------------------------------------------------ opens and releases

    def answer(self, fh: int, flags: int) -> tuple[int, bool]:
        """The open (or create) ``fh`` the core just made, with the caller's ``flags``:
        (backing id, direct_io) for the reply — (0, False): through the mount as before.
        Must be called with no await between it and the reply (the inode's mode is
        counted from here)."""
        h = self.core.handles.files.get(fh)
        if h is None:
            return 0, False
        ino = h.node.ino
        io = self.inodes.get(ino)
        if io is None:
            io = self.inodes[ino] = InodeIO()
        if io.backing is not None:
            # the kernel refuses any other mode beside it: passthrough with its file
            direct = not self._uses_backing(h, io.backing, flags)
            self._count(fh, ino, io, True)
            if h.writer and not direct:
                self._writes_through(fh, h, io)
            self.opens += 1
            self.direct += direct
            return io.backing.id, direct
        if io.cached or not self.on:
            self._count(fh, ino, io, False)
            return 0, False
        entry = self._whole_local_file(h, flags) if h.writer else self._whole_copy(h, flags)
        backing_id = self._register(h.fd) if entry is not None else 0
        if not backing_id:
            self._count(fh, ino, io, False)
            return 0, False
        backing = io.backing = Backing(backing_id, entry)
        if h.writer:
            self._writes_through(fh, h, io)
        cache = self.core.cache
        cache.hold(entry)
        cache.pin(entry, backing.pin)  # never evicted: the kernel reads the file itself
        cache.touch(entry, 0, entry.size)  # (its reads are not seen: read at open and close)
        self.registered += 1
        self._count(fh, ino, io, True)
        self.opens += 1
        return backing_id, False

    def released(self, fh: int) -> None:
        """The kernel released ``fh`` (after the core did): the last passthrough file of
        an inode drops its backing id."""
        rec = self.handles.pop(fh, None)
        if rec is None:
            return
        ino, passthrough = rec
        io = self.inodes.get(ino)
        if io is None:
            return
        if fh in io.writers:
            del io.writers[fh]
            if not io.writers:
                self.writing.pop(ino, None)
        if passthrough:
            io.passthrough -= 1
            if io.passthrough == 0 and io.backing is not None:
                self._drop(io.backing)
                io.backing = None
        else:
            io.cached -= 1
        if io.passthrough <= 0 and io.cached <= 0:
            del self.inodes[ino]

    def close(self) -> None:
        """The mount ends: every backing id registered is dropped."""
        for io in self.inodes.values():
            if io.backing is not None:
                self._drop(io.backing)
                io.backing = None
        self.inodes.clear()
        self.handles.clear()
        self.writing.clear()

    # ------------------------------------------------------------ writers

    def writes_through(self, fh: int) -> bool:
        """Whether the kernel writes through handle ``fh`` itself."""
        rec = self.handles.get(fh)
        io = self.inodes.get(rec[0]) if rec is not None else None
        return io is not None and fh in io.writers

    def sync(self, ino: int) -> None:
        """The files the kernel writes of inode ``ino``, as they are now, taken into the
        core (size, mtime, written: ``Writes.written_by_kernel``) where they changed since
        they were last taken. Before anything reads the inode's size or uploads it."""
        io = self.writing.get(ino)
        if io is None:
            return
        files = self.core.handles.files
        now = time.time_ns()
        for fh, seen in list(io.writers.items()):
            h = files.get(fh)
            if h is None or h.fd is None:
                continue
            st = os.fstat(h.fd)
            stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if stamp != seen:
                self.core.writes.written_by_kernel(h, st.st_size, st.st_mtime_ns)
            # another descriptor may write again within the same timestamp tick, unseen
            others = len(io.writers) > 1
            io.writers[fh] = None if others and now - st.st_ctime_ns < _RECENT_NS else stamp

    def sync_all(self) -> None:
        """``sync`` of every inode the kernel writes (before an operation that may act on
        one of them by its name: a create or truncating open, a rename, an unlink)."""
        for ino in list(self.writing):
            self.sync(ino)

    def _writes_through(self, fh: int, h, io: InodeIO) -> None:
        st = os.fstat(h.fd)
        io.writers[fh] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        self.writing[h.node.ino] = io

    # ------------------------------------------------------------ the rules

    def _count(self, fh: int, ino: int, io: InodeIO, passthrough: bool) -> None:
        self.handles[fh] = (ino, passthrough)
        if passthrough:
            io.passthrough += 1
        else:
            io.cached += 1

    def _uses_backing(self, h, backing: Backing, flags: int) -> bool:
        """Whether handle ``h`` may read (and write) the backing file itself: a reader of
        the version whose copy it is, or of the local file it is; a writer of that local
        file (``-o passthrough=rw``)."""
        entry, back = h.entry, backing.entry
        if back.dirty:  # a file written here: its local file is what it is now
            if h.writer:
                return self._whole_local_file(h, flags) is back
            return (entry is None or entry is back) and not flags & os.O_DIRECT \
                and self.core.cache.get(back.bucket, back.key) is back
        return (not h.writer and entry is not None and not entry.dirty
                and bool(entry.etag) and entry.etag == back.etag and entry.size == back.size)

    @staticmethod
    def _whole_copy(h, flags: int):
        """The cache entry a new reading handle may be served from by the kernel: clean,
        its node's version (or a removed file's), every byte in its file."""
        entry, node = h.entry, h.node
        if h.writer or h.fd is None or entry is None or flags & os.O_DIRECT:
            return None
        if entry.dirty or not entry.etag or (entry.etag != node.etag and not node.gone):
            return None
        present = entry.present
        if present is not None and not present.covers(0, entry.size):
            return None
        return entry

    def _whole_local_file(self, h, flags: int):
        """The dirty entry a new writing handle may let the kernel write itself
        (``-o passthrough=rw``): the key's live local file, every byte of it local, without
        a ranges log; journaled here (the mount will not see its first byte)."""
        entry = h.entry
        if not self.writes or h.fd is None or entry is None or flags & os.O_DIRECT:
            return None
        core = self.core
        if not entry.dirty or h.node.gone or core.cache.get(entry.bucket, entry.key) is not entry:
            return None
        if entry.source is not None and self._whole_and_small(entry):
            # an object opened without O_TRUNC whose every byte is local and whose upload is
            # one PUT anyway: it needs no ranges log (nothing is copied server-side)
            try:
                core.written.unsource(entry)
            except Exception as exc:  # noqa: BLE001 — a full disk: the mount writes it, as before
                log.info("FUSE passthrough skipped for writing %s/%s: %s", entry.bucket, entry.key, exc)
                return None
        if entry.present is not None or entry.source is not None \
                or os.path.basename(entry.path) in core.written.logs:
            return None
        try:
            core.written.journal(entry)
        except Exception as exc:  # noqa: BLE001 — a full disk: the mount writes it, as before
            log.info("FUSE passthrough skipped for writing %s/%s: %s", entry.bucket, entry.key, exc)
            return None
        return entry

    def _whole_and_small(self, entry) -> bool:
        """A written file based on an object holds all of its bytes locally and is smaller
        than a part (its upload sends the whole file: no range is copied server-side)."""
        part = getattr(self.core.store, "part_size", 0)
        return not self.core.written.sparse(entry) and entry.size < part \
            and entry.source_len < part

    def _register(self, fd: int) -> int:
        try:
            return self._backing_open(fd)
        except OSError as exc:
            why = _SYSTEMATIC.get(exc.errno)
            if why is not None:
                self._turn_off(f"the kernel refused a backing file: {os.strerror(exc.errno)}: {why}")
            else:
                log.info("FUSE passthrough skipped for one open: %s", exc)
            return 0

    def _drop(self, backing: Backing) -> None:
        try:
            self._backing_close(backing.id)
        except OSError as exc:  # the kernel has let go of it already (unmounted): nothing held
            log.debug("backing id %d: %s", backing.id, exc)
        entry = backing.entry
        cache = self.core.cache
        cache.unpin(entry, backing.pin)
        if cache.get(entry.bucket, entry.key) is entry:
            cache.touch(entry, 0, entry.size)
        cache.release(entry)


def report(core) -> dict:
    """``delvefs status``'s view of passthrough (``core.passthrough``, attached by the
    FUSE adapter; a core without one, as in tests, is off)."""
    pt = getattr(core, "passthrough", None)
    if pt is None:
        return {"state": "off", "reason": "no FUSE adapter", "writes": False, "writing_files": 0,
                "open_files": 0, "backing_files": 0, "opens": 0, "direct_opens": 0,
                "registered": 0}
    return pt.report()
