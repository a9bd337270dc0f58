"""FUSE passthrough on real mounts (real handler, MinIO, RabbitMQ, FUSE; Linux >= 6.9 and
CAP_SYS_ADMIN, else the tests that need it skip): files whose whole object is cached are
read by the kernel from their cache file without a READ request to the mount (its
request counters, ``--metrics-addr``, say so); the mount falls back to serving every read
itself with ``-o passthrough=off``, in eager mode and when the kernel refuses the cache
file (a cache directory on overlayfs), and ``delvefs status`` says which
(docs/SEMANTICS.md, "Passthrough")."""
from __future__ import annotations

import json
import mmap
import os
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from delvefs.client.mount.passthrough import has_cap_sys_admin
from delvefs.devtools.localservices import free_port

from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, data_views, handler, mounts, put  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]

MiB = 1 << 20


def kernel_has_passthrough() -> bool:
    release = os.uname().release.split("-")[0].split(".")
    try:
        major, minor = int(release[0]), int(release[1])
    except (ValueError, IndexError):
        return False
    return (major, minor) >= (6, 9) and has_cap_sys_admin()


needs_passthrough = pytest.mark.skipif(not kernel_has_passthrough(),
                                       reason="FUSE passthrough needs Linux >= 6.9 and CAP_SYS_ADMIN")


class Requests:
    """The FUSE requests a mount answered, by operation (its Prometheus metrics)."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}/metrics"

    def __call__(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url, timeout=30) as resp:
            text = resp.read().decode()
        counts: dict[str, int] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "delvefs_mount_fuse_request_seconds_count":
                    counts[s.labels["op"]] = int(s.value)
        return counts


def mount_with_metrics(mounts, bucket, *extra, ttl: float = 3600, **kw):
    port = free_port()
    mp = mounts.mount(data_views(bucket, ttl=ttl), "--metrics-addr", f"127.0.0.1:{port}", *extra, **kw)
    return mp, Requests(port)


def status(mounts, mp) -> dict:
    r = mounts.run("status", str(mp), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def read_all(path, chunk: int = MiB) -> bytes:
    """The file's bytes, not from the pages the kernel kept of its inode (dropped first)."""
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        out = bytearray()
        while block := f.read(chunk):
            out += block
        return bytes(out)


@needs_passthrough
def test_a_cached_file_is_read_by_the_kernel_without_read_requests(mounts, s3, bucket):
    body = os.urandom(5 * MiB + 123)
    put(s3, bucket, "data/big.bin", body)
    put(s3, bucket, "data/small.txt", b"small\n")
    mp, requests = mount_with_metrics(mounts, bucket)
    st = status(mounts, mp)
    assert st["passthrough"]["state"] == "on", st["passthrough"]

    # the first read fetches the object through the mount (READ requests)...
    assert read_all(mp / "data/big.bin") == body
    first = requests()
    assert first.get("read", 0) > 0
    # ...once its whole object is cached, an open is served from the cache file
    assert read_all(mp / "data/big.bin") == body
    with open(mp / "data/big.bin", "rb") as f:
        f.seek(3 * MiB + 7)
        assert f.read(4096) == body[3 * MiB + 7:3 * MiB + 7 + 4096]
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[-10:] == body[-10:] and len(m) == len(body)
        # a second descriptor of the same inode shares the backing file
        with open(mp / "data/big.bin", "rb") as g:
            assert g.read(100) == body[:100]
            assert status(mounts, mp)["passthrough"]["open_files"] == 2
    after = requests()
    assert after.get("read", 0) == first["read"], (first, after)
    assert after["open"] >= first["open"] + 3
    # small files too, once cached (a whole GET at the first read)
    assert (mp / "data/small.txt").read_bytes() == b"small\n"
    reads = requests().get("read", 0)
    assert (mp / "data/small.txt").read_bytes() == b"small\n"
    assert requests().get("read", 0) == reads
    pt = status(mounts, mp)["passthrough"]
    assert pt["open_files"] == 0 and pt["backing_files"] == 0 and pt["opens"] >= 4


def reads_twice(mp, requests, name: str, body: bytes) -> tuple[int, int]:
    """READ requests of a first and of a second whole read of ``name``."""
    before = requests().get("read", 0)
    assert read_all(mp / name) == body
    first = requests().get("read", 0)
    assert read_all(mp / name) == body
    return first - before, requests().get("read", 0) - first


def test_passthrough_off_serves_every_read_through_the_mount(mounts, s3, bucket):
    body = os.urandom(3 * MiB + 5)
    put(s3, bucket, "data/f.bin", body)
    mp, requests = mount_with_metrics(mounts, bucket, "-o", "passthrough=off")
    pt = status(mounts, mp)["passthrough"]
    assert pt["state"] == "off" and pt["reason"] == "-o passthrough=off"
    first, second = reads_twice(mp, requests, "data/f.bin", body)
    assert first > 0 and second > 0
    assert status(mounts, mp)["passthrough"]["opens"] == 0
    r = mounts.run("status", str(mp))
    assert "passthrough: off (-o passthrough=off)" in r.stdout


def test_eager_mode_keeps_the_writeback_cache_and_goes_without_passthrough(mounts, s3, bucket):
    body = os.urandom(MiB + 1)
    put(s3, bucket, "data/f.bin", body)
    mp, requests = mount_with_metrics(mounts, bucket, "--eager")
    pt = status(mounts, mp)["passthrough"]
    assert pt["state"] == "off" and "writeback cache" in pt["reason"]
    first, second = reads_twice(mp, requests, "data/f.bin", body)
    assert first > 0  # (the kernel may keep the pages it read the first time)
    (mp / "data/new.txt").write_bytes(b"eager")
    assert (mp / "data/new.txt").read_bytes() == b"eager"
    assert status(mounts, mp)["passthrough"]["opens"] == 0


@pytest.fixture
def overlay_dir(tmp_path):
    """A directory on overlayfs (a stacked file system: the kernel refuses its files as
    backing files of a mount that negotiated max_stack_depth 1)."""
    base = tmp_path / "overlay"
    dirs = {n: base / n for n in ("lower", "upper", "work", "merged")}
    for d in dirs.values():
        d.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}",
                        str(dirs["merged"])], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount overlayfs here: {r.stderr.strip()}")
    yield dirs["merged"]
    subprocess.run(["umount", "-l", str(dirs["merged"])], capture_output=True)


@needs_passthrough
def test_a_refused_backing_file_turns_passthrough_off_and_reads_go_on(mounts, s3, bucket, overlay_dir):
    body = os.urandom(2 * MiB + 9)
    put(s3, bucket, "data/f.bin", body)
    cache = overlay_dir / "cache"
    mp, requests = mount_with_metrics(mounts, bucket, cache_dir=cache)
    assert status(mounts, mp)["passthrough"]["state"] == "on"
    first, second = reads_twice(mp, requests, "data/f.bin", body)
    assert first > 0 and second > 0  # the second open asked for a backing file: refused (ELOOP)
    pt = status(mounts, mp)["passthrough"]
    assert pt["state"] == "off" and "stacked file system" in pt["reason"], pt
    assert pt["opens"] == 0 and pt["registered"] == 0
    # from then on, every open is served by the mount, writes too
    (mp / "data/new.txt").write_bytes(b"written")
    assert (mp / "data/new.txt").read_bytes() == b"written"
    assert s3.get_object(Bucket=bucket, Key="data/new.txt")["Body"].read() == b"written"
    log = (cache / "mount.log").read_text()
    assert "FUSE passthrough off from now on" in log and log.count("FUSE passthrough off") == 1
    mounts.umount(mp)


@needs_passthrough
def test_a_writer_beside_a_passthrough_reader_is_served_by_the_mount(mounts, s3, bucket):
    """The kernel refuses an open without passthrough while the inode is open with it (EIO):
    a writer opened beside a passthrough reader gets the reader's backing file and direct
    I/O — its reads and writes go to the mount as before; the reader keeps its version."""
    old = os.urandom(MiB + 3)
    put(s3, bucket, "data/f.bin", old)
    mp, requests = mount_with_metrics(mounts, bucket)
    path = mp / "data/f.bin"
    assert read_all(path) == old
    reader = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(reader, 10, 0) == old[:10]
        writes = requests().get("write", 0)
        # a writer (not truncating) beside it: served by the mount
        with open(path, "r+b") as w:
            w.seek(5)
            w.write(b"HELLO")
            w.seek(0)
            assert w.read(12) == old[:5] + b"HELLO" + old[10:12]
        assert requests().get("write", 0) > writes
        new = old[:5] + b"HELLO" + old[10:]
        assert s3.get_object(Bucket=bucket, Key="data/f.bin")["Body"].read() == new
        # a reader opened beside the first one now reads what the file is now
        with open(path, "rb") as r2:
            assert r2.read() == new
        # the first reader keeps the version it opened (one version per open file)
        assert os.pread(reader, len(old), 0) == old
        # a truncating writer beside it
        with open(path, "wb") as w:
            w.write(b"short")
        assert s3.get_object(Bucket=bucket, Key="data/f.bin")["Body"].read() == b"short"
        assert os.pread(reader, 10, 0) == old[:10]
        pt = status(mounts, mp)["passthrough"]
        assert pt["direct_opens"] >= 3 and pt["backing_files"] == 1
    finally:
        os.close(reader)
    # nothing open any more: the next open reads the new file
    assert read_all(path) == b"short"
    wait_until(lambda: status(mounts, mp)["passthrough"]["backing_files"] == 0, 10, "the backing id dropped")


def get(s3, bucket, key) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


@needs_passthrough
def test_rw_new_and_truncated_files_are_written_by_the_kernel_and_uploaded_at_close(mounts, s3, bucket):
    put(s3, bucket, "data/old.txt", b"old content")
    mp, requests = mount_with_metrics(mounts, bucket, "-o", "passthrough=rw")
    st = status(mounts, mp)["passthrough"]
    assert st["state"] == "on" and st["writes"], st
    before = requests()
    chunk = os.urandom(4096)
    path = mp / "data/new.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for i in range(1280):  # 5 MiB in 4 KiB writes
            assert os.write(fd, chunk) == 4096
            if i == 639:  # sizes shown while it is written are the file's
                assert os.fstat(fd).st_size == 640 * 4096
                assert os.stat(path).st_size == 640 * 4096
                # a reader opened meanwhile reads what the file is now, through passthrough too
                assert read_all(path) == chunk * 640
        assert status(mounts, mp)["passthrough"]["writing_files"] == 1
    finally:
        os.close(fd)  # the upload
    body = chunk * 1280
    assert get(s3, bucket, "data/new.bin") == body
    assert os.stat(path).st_size == len(body)
    after = requests()
    assert after.get("write", 0) == before.get("write", 0), (before, after)
    assert read_all(path) == body

    # O_TRUNC of an object in S3; fsync uploads, later writes are uploaded at close
    with open(mp / "data/old.txt", "wb") as f:
        f.write(b"first")
        f.flush()
        os.fsync(f.fileno())
        assert get(s3, bucket, "data/old.txt") == b"first"
        f.write(b" and second")
    assert get(s3, bucket, "data/old.txt") == b"first and second"
    # ftruncate through such a descriptor (a SETATTR the mount does on the same file)
    with open(mp / "data/cut.txt", "wb") as f:
        f.write(b"0123456789")
        f.flush()
        os.ftruncate(f.fileno(), 4)
        f.seek(0, os.SEEK_END)
        f.write(b"++")
    assert get(s3, bucket, "data/cut.txt") == b"0123++"
    assert (mp / "data/cut.txt").read_bytes() == b"0123++"
    # a truncating open beside a descriptor the kernel writes truncates what it wrote
    fd = os.open(mp / "data/t.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"x" * 100_000, 0)
        with open(mp / "data/t.bin", "wb") as f:
            f.write(b"short")
        os.truncate(mp / "data/t.bin", 8)
        assert os.pread(fd, 100, 0) == b"short\0\0\0"
    finally:
        os.close(fd)
    assert get(s3, bucket, "data/t.bin") == b"short\0\0\0"
    # mmap writes before the close reach S3
    with open(mp / "data/mapped.bin", "w+b") as f:
        f.truncate(8192)
        with mmap.mmap(f.fileno(), 8192) as m:
            m[100:105] = b"MMAP!"
            m.flush()
    assert get(s3, bucket, "data/mapped.bin") == b"\0" * 100 + b"MMAP!" + b"\0" * (8192 - 105)
    assert requests().get("write", 0) == before.get("write", 0)
    assert status(mounts, mp)["passthrough"]["writing_files"] == 0


@needs_passthrough
def test_eager_rw_writes_through_passthrough_instead_of_the_writeback_cache(mounts, s3, bucket):
    """``--eager -o passthrough=rw``: the kernel writes new files into their local file
    itself (no write request), close returns once the file is journaled, `delvefs sync`
    uploads it whole; an uploaded file opened without O_TRUNC and written again is written
    by the kernel too while it is whole in the cache and smaller than a part (8 MiB), else
    through the mount (its ranges log: the upload copies the rest server-side)."""
    mp, requests = mount_with_metrics(mounts, bucket, "--eager", "-o", "passthrough=rw")
    st = status(mounts, mp)
    assert st["passthrough"]["state"] == "on" and st["passthrough"]["writes"], st["passthrough"]
    before = requests()
    chunk = os.urandom(4096)
    with open(mp / "data/new.bin", "wb") as f:
        for _ in range(1280):  # 5 MiB in 4 KiB writes
            f.write(chunk)
    assert os.stat(mp / "data/new.bin").st_size == 1280 * 4096
    assert requests().get("write", 0) == before.get("write", 0)
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    assert get(s3, bucket, "data/new.bin") == chunk * 1280
    with open(mp / "data/new.bin", "r+b") as f:  # written again in place
        f.seek(4096)
        f.write(b"again")
    assert requests().get("write", 0) == before.get("write", 0)
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    assert get(s3, bucket, "data/new.bin") == chunk + b"again" + (chunk * 1280)[4096 + 5:]
    assert (mp / "data/new.bin").read_bytes()[4096:4101] == b"again"
    # a file of a part or more, written in place: through the mount, rebuilt server-side
    big = os.urandom(MiB) * 9
    (mp / "data/big.bin").write_bytes(big)
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    before = requests()
    with open(mp / "data/big.bin", "r+b") as f:
        f.seek(5 * MiB)
        f.write(b"changed")
    assert requests().get("write", 0) > before.get("write", 0)
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    assert get(s3, bucket, "data/big.bin") == big[:5 * MiB] + b"changed" + big[5 * MiB + 7:]


@needs_passthrough
def test_eager_rw_bytes_the_kernel_wrote_survive_a_killed_mount(mounts, s3, bucket):
    """The record is journaled before the kernel writes a byte into the file: a mount
    killed while a file it never saw a write of is open comes back with the file whole
    (the same views file mounted again elsewhere replays it)."""
    state = mounts.tmp / "state" / "mounts"
    mp = mounts.mount(data_views(bucket), "--eager", "-o", "passthrough=rw",
                      cache_dir=state / "first")
    assert status(mounts, mp)["passthrough"]["writes"]
    body = os.urandom(3 * MiB + 17)
    fd = os.open(mp / "data/kernel.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    assert os.write(fd, body) == len(body)   # into the cache file by the kernel itself
    mounts.kill(mp)
    try:
        os.close(fd)
    except OSError:
        pass
    mounts.mount_again("elsewhere", state / "second")
    wait_until(lambda: get(s3, bucket, "data/kernel.bin") == body, 60,
               "the killed mount's file uploaded whole by the next mount")


@needs_passthrough
def test_rw_a_copy_into_a_file_the_kernel_writes_is_copied_by_the_kernel(mounts, s3, bucket):
    data = os.urandom(3 * MiB + 5)
    put(s3, bucket, "data/big.bin", data)
    mp, requests = mount_with_metrics(mounts, bucket, "-o", "passthrough=rw")
    r = subprocess.run(["cp", str(mp / "data/big.bin"), str(mp / "data/copy.bin")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert get(s3, bucket, "data/copy.bin") == data
    assert read_all(mp / "data/copy.bin") == data
    # cat a b > c: a copy at 0, then one further on (refused by the core: read and write)
    with open(mp / "data/cat.bin", "wb") as out:
        for name in ("big.bin", "copy.bin"):
            with open(mp / "data" / name, "rb") as src:
                n = len(data)
                done = 0
                while done < n:
                    done += os.copy_file_range(src.fileno(), out.fileno(), n - done)
    assert get(s3, bucket, "data/cat.bin") == data + data


@needs_passthrough
def test_a_passthrough_descriptor_reads_its_version_to_the_end_over_changes(mounts, s3, bucket):
    """One version per open file: the cache file a descriptor reads is that version's,
    held whole while it is open — an outside overwrite or a removal here changes nothing
    for it; the next open reads the new version."""
    old, new = os.urandom(4 * MiB + 1), os.urandom(4 * MiB + 2)
    put(s3, bucket, "data/f.bin", old)
    put(s3, bucket, "data/g.bin", old)
    mp, requests = mount_with_metrics(mounts, bucket, ttl=1)
    assert read_all(mp / "data/f.bin") == old and read_all(mp / "data/g.bin") == old
    f = os.open(mp / "data/f.bin", os.O_RDONLY)
    g = os.open(mp / "data/g.bin", os.O_RDONLY)
    try:
        assert os.pread(f, 16, 0) == old[:16]
        put(s3, bucket, "data/f.bin", new)  # by someone else
        wait_until(lambda: os.stat(mp / "data/f.bin").st_size == len(new), CHANGE_TIMEOUT, "the new size")
        assert read_all(mp / "data/f.bin") == new
        os.unlink(mp / "data/g.bin")  # through this mount
        reads = requests().get("read", 0)
        assert os.pread(f, len(old), 0) == old
        assert os.pread(g, len(old), 0) == old
        assert requests().get("read", 0) == reads
    finally:
        os.close(f)
        os.close(g)


@needs_passthrough
def test_a_file_open_through_passthrough_is_never_evicted_under_it(mounts, s3, bucket):
    """The cache punches evicted blocks out of its files; the kernel reads a passthrough
    file itself, so the file is pinned whole while open (the bound is exceeded instead)."""
    a, b = os.urandom(3 * MiB), os.urandom(3 * MiB)
    put(s3, bucket, "data/a.bin", a)
    put(s3, bucket, "data/b.bin", b)
    port = free_port()
    mp = mounts.mount(data_views(bucket, ttl=3600), "--cache-size", "4MiB",
                      "--metrics-addr", f"127.0.0.1:{port}")
    assert read_all(mp / "data/a.bin") == a
    fd = os.open(mp / "data/a.bin", os.O_RDONLY)
    try:
        assert status(mounts, mp)["passthrough"]["open_files"] == 1
        assert read_all(mp / "data/b.bin") == b  # 6 MiB > 4 MiB: something must go, not a's bytes
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(fd, len(a), 0) == a
    finally:
        os.close(fd)
    wait_until(lambda: status(mounts, mp)["cache"]["bytes"] <= 4 * MiB, 10, "the bound kept again")
