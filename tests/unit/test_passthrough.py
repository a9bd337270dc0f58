"""The passthrough policy (delvefs/client/mount/passthrough.py) against fakes of the core's
handles and cache: which opens the kernel may serve from their cache file, the kernel's
one-mode-per-inode and one-backing-file-per-inode rules (fs/fuse/iomode.c: a mix is EIO),
pinning, dropping ids, and falling back when the kernel refuses."""
from __future__ import annotations

import errno
import os

from delvefs.client.mount.cache.cacheentry import CacheEntry
from delvefs.client.mount.fs.handles import ReadHandle, WriteHandle
from delvefs.client.mount.fs.inodes import File
from delvefs.client.mount.passthrough import Passthrough, has_cap_sys_admin, report
from delvefs.client.mount.cache.ranges import RangeSet


class FakeCache:
    def __init__(self):
        self.held: dict[int, int] = {}
        self.touched = 0
        self.entries: dict = {}

    def hold(self, entry):
        self.held[id(entry)] = self.held.get(id(entry), 0) + 1

    def release(self, entry):
        self.held[id(entry)] -= 1

    def touch(self, entry, start, end):
        self.touched += 1

    def pin(self, entry, pin):
        entry.pinned.append(pin)

    def unpin(self, entry, pin):
        entry.pinned.remove(pin)

    def get(self, bucket, key):
        return self.entries.get((bucket, key))


class FakeHandles:
    def __init__(self):
        self.files: dict[int, ReadHandle | WriteHandle] = {}


class FakeCore:
    def __init__(self):
        self.cache = FakeCache()
        self.handles = FakeHandles()


class Kernel:
    """backing_open/backing_close as the kernel answers them."""

    def __init__(self, refuse: int | None = None):
        self.refuse = refuse
        self.ids: dict[int, int] = {}
        self.next = 1

    def open(self, fd: int) -> int:
        if self.refuse is not None:
            raise OSError(self.refuse, os.strerror(self.refuse))
        self.ids[self.next] = fd
        self.next += 1
        return self.next - 1

    def close(self, backing_id: int) -> None:
        del self.ids[backing_id]


def node(ino: int = 10, etag: str = "e1") -> File:
    n = File.__new__(File)
    n.ino, n.etag, n.gone = ino, etag, False
    return n


def entry(size: int = 100, etag: str = "e1", present: RangeSet | None = None) -> CacheEntry:
    e = CacheEntry("b", f"k-{etag}", f"/nowhere/{etag}")
    e.etag, e.size = etag, size
    e.present = RangeSet([(0, size)]) if present is None else present
    return e


def setup(refuse=None, **kw):
    core, kernel = FakeCore(), Kernel(refuse)
    pt = Passthrough(core, wanted=True, state=lambda: "negotiated",
                     backing_open=kernel.open, backing_close=kernel.close, **kw)
    return core, kernel, pt


def handle(core, fh: int, n: File, e: CacheEntry | None, writer: bool = False) -> int:
    fd = 100 + fh if e is not None else None
    if writer:
        h = WriteHandle(n, fd, e)
    else:
        h = ReadHandle(n)
        h.entry, h.fd = e, fd
    core.handles.files[fh] = h
    return fh


def test_a_reader_of_a_whole_cached_copy_gets_a_backing_id_pinned_until_its_release():
    core, kernel, pt = setup()
    n, e = node(), entry()
    assert pt.answer(handle(core, 1, n, e), os.O_RDONLY) == (1, False)
    assert kernel.ids == {1: 101}
    assert e.pinned == [(0, 100)] and core.cache.held[id(e)] == 1
    # a second reader of the inode shares the id (the kernel allows one backing file per inode)
    assert pt.answer(handle(core, 2, n, e), os.O_RDONLY) == (1, False)
    assert pt.report()["open_files"] == 2 and pt.report()["backing_files"] == 1
    pt.released(1)
    assert kernel.ids == {1: 101} and e.pinned == [(0, 100)]
    pt.released(2)
    assert kernel.ids == {} and e.pinned == [] and core.cache.held[id(e)] == 0
    assert pt.inodes == {} and pt.handles == {}


def test_partial_copies_writers_and_o_direct_stay_on_the_mounts_path():
    core, kernel, pt = setup()
    partial = entry(present=RangeSet([(0, 50)]))
    assert pt.answer(handle(core, 1, node(1), partial), os.O_RDONLY) == (0, False)
    assert pt.answer(handle(core, 2, node(2), None), os.O_RDONLY) == (0, False)  # nothing cached
    assert pt.answer(handle(core, 3, node(3), entry(), writer=True), os.O_RDWR) == (0, False)
    assert pt.answer(handle(core, 4, node(4), entry()), os.O_RDONLY | os.O_DIRECT) == (0, False)
    dirty = entry()
    dirty.dirty = True
    assert pt.answer(handle(core, 5, node(5), dirty), os.O_RDONLY) == (0, False)
    other_version = entry(etag="old")
    assert pt.answer(handle(core, 6, node(6, etag="new"), other_version), os.O_RDONLY) == (0, False)
    assert kernel.ids == {}


def test_beside_a_cached_open_every_open_of_the_inode_is_cached():
    core, kernel, pt = setup()
    n, e = node(), entry()
    assert pt.answer(handle(core, 1, n, e, writer=True), os.O_WRONLY) == (0, False)
    # a reader that could go through: the kernel would refuse it (EIO) beside a cached open
    assert pt.answer(handle(core, 2, n, e), os.O_RDONLY) == (0, False)
    pt.released(1)
    assert pt.answer(handle(core, 3, n, e), os.O_RDONLY) == (0, False)  # fh 2 is still cached
    pt.released(2)
    pt.released(3)
    assert pt.answer(handle(core, 4, n, e), os.O_RDONLY) == (1, False)  # nothing open: through


def test_beside_a_passthrough_open_a_writer_or_another_version_gets_the_id_and_direct_io():
    core, kernel, pt = setup()
    n, e = node(), entry()
    assert pt.answer(handle(core, 1, n, e), os.O_RDONLY) == (1, False)
    dirty = entry(etag="")
    dirty.dirty = True
    assert pt.answer(handle(core, 2, n, dirty, writer=True), os.O_RDWR) == (1, True)
    assert pt.answer(handle(core, 3, n, None), os.O_RDONLY) == (1, True)   # reads what it is now
    assert pt.answer(handle(core, 4, n, e), os.O_RDONLY) == (1, False)     # the same version
    assert pt.report()["direct_opens"] == 2
    for fh in (1, 2, 3):
        pt.released(fh)
    assert kernel.ids == {1: 101}  # fh 4 still holds it
    pt.released(4)
    assert kernel.ids == {}


def test_a_refusal_turns_it_off_with_one_reason_and_the_open_goes_through_the_mount():
    core, kernel, pt = setup(refuse=errno.ELOOP)
    assert pt.answer(handle(core, 1, node(1), entry()), os.O_RDONLY) == (0, False)
    r = pt.report()
    assert r["state"] == "off" and "stacked file system" in r["reason"]
    kernel.refuse = None
    assert pt.answer(handle(core, 2, node(2), entry()), os.O_RDONLY) == (0, False)
    assert kernel.ids == {}


def test_a_passing_refusal_skips_one_open_only():
    core, kernel, pt = setup(refuse=errno.EMFILE)
    assert pt.answer(handle(core, 1, node(1), entry()), os.O_RDONLY) == (0, False)
    assert pt.report()["state"] == "on"
    kernel.refuse = None
    assert pt.answer(handle(core, 2, node(2), entry()), os.O_RDONLY) == (1, False)


def test_not_negotiated_or_not_wanted_is_off_and_says_why():
    core = FakeCore()
    pt = Passthrough(core, wanted=True, state=lambda: "no INIT reply yet",
                     backing_open=None, backing_close=None)
    assert not pt.on and pt._on is None  # asked again later
    pt._state_fn = lambda: "the kernel did not offer it"
    assert pt.report() == {"state": "off", "reason": "not negotiated: the kernel did not offer it",
                           "writes": False, "writing_files": 0, "open_files": 0,
                           "backing_files": 0, "opens": 0, "direct_opens": 0, "registered": 0}
    off = Passthrough(core, wanted=False, why_not="-o passthrough=off")
    assert off.report()["reason"] == "-o passthrough=off"
    fh = handle(core, 1, node(), entry())
    assert off.answer(fh, os.O_RDONLY) == (0, False)
    off.released(fh)
    assert off.inodes == {}
    assert report(FakeCore())["state"] == "off"


def test_close_drops_every_id(tmp_path):
    core, kernel, pt = setup()
    pt.answer(handle(core, 1, node(1), entry()), os.O_RDONLY)
    pt.answer(handle(core, 2, node(2, etag="x"), entry(etag="x")), os.O_RDONLY)
    assert len(kernel.ids) == 2
    pt.close()
    assert kernel.ids == {}


def test_cap_sys_admin_is_read_from_the_effective_set(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t000001ffffffffff\n")
    assert has_cap_sys_admin(str(status))
    status.write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    assert not has_cap_sys_admin(str(status))
    assert not has_cap_sys_admin(str(tmp_path / "missing"))


class FakeWrites:
    def __init__(self):
        self.calls = []

    def written_by_kernel(self, h, size, mtime_ns):
        self.calls.append((h, size))


class FakeWritten:
    def __init__(self):
        self.logs = {}
        self.journaled = []

    def journal(self, entry):
        self.journaled.append(entry)


def test_rw_a_new_local_file_is_written_by_the_kernel_and_taken_from_its_file(tmp_path):
    core, kernel, pt = setup(writes=True)
    core.writes, core.written = FakeWrites(), FakeWritten()
    path = tmp_path / "w-1"
    path.write_bytes(b"")
    e = CacheEntry("b", "k", str(path))
    e.etag, e.dirty, e.present = "", True, None
    core.cache.entries[("b", "k")] = e
    n = node(etag="")
    h = WriteHandle(n, os.open(path, os.O_RDWR), e)
    core.handles.files[1] = h
    try:
        assert pt.answer(1, os.O_WRONLY | os.O_CREAT) == (1, False)
        assert core.written.journaled == [e]  # before the kernel writes its first byte
        assert pt.writes_through(1) and n.ino in pt.writing
        pt.sync(n.ino)
        assert core.writes.calls == []  # unchanged since the open
        os.pwrite(h.fd, b"kernel", 0)    # what the kernel does for the program
        pt.sync(n.ino)
        assert core.writes.calls == [(h, 6)]
        pt.sync(n.ino)
        assert len(core.writes.calls) == 1
        # a reader opened meanwhile reads the local file itself; a sparse writer does not
        assert pt.answer(handle(core, 2, n, None), os.O_RDONLY) == (1, False)
        core.written.logs[os.path.basename(e.path)] = object()
        h3 = WriteHandle(n, h.fd, e)
        core.handles.files[3] = h3
        assert pt.answer(3, os.O_RDWR) == (1, True)
        assert pt.report()["writing_files"] == 1
        for fh in (1, 2, 3):
            pt.released(fh)
        assert pt.writing == {} and kernel.ids == {}
    finally:
        os.close(h.fd)


def test_rw_off_keeps_writers_on_the_mounts_path(tmp_path):
    core, kernel, pt = setup()
    core.written = FakeWritten()
    e = CacheEntry("b", "k", str(tmp_path / "w"))
    e.dirty, e.present = True, None
    core.cache.entries[("b", "k")] = e
    assert pt.answer(handle(core, 1, node(), e, writer=True), os.O_WRONLY) == (0, False)
    assert core.written.journaled == [] and not pt.writes_through(1)
