"""Eager mode, `delvefs sync`, conditional uploads and journal replay through a real mount
(real MinIO, RabbitMQ, handler and FUSE)."""
from __future__ import annotations

import ctypes
import errno
import os
import shutil

import pytest

from ..waiting import wait_until
from .mounts import data_views, handler, listdir, mounts, put  # noqa: F401
from .test_mount_write import get, keys, own  # noqa: F401  (own: services a test may stop)

pytestmark = [pytest.mark.services, pytest.mark.fuse]


def write_back(fd: int) -> None:
    """Make the kernel send the pages written through ``fd`` to the mount and wait for them
    (sync_file_range: the data only; an eager mount's writeback cache holds them until
    close, fsync or the kernel's own writeback)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    wait_before, write, wait_after = 1, 2, 4
    if libc.sync_file_range(fd, 0, 0, wait_before | write | wait_after) != 0:
        raise OSError(ctypes.get_errno(), "sync_file_range")


def conflict_copies(directory, name: str) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(name + ".conflict-")]


def test_eager_closes_then_sync_uploads_and_batched_deletes(mounts, s3, bucket):
    mp = mounts.mount(data_views(bucket), "--eager")
    (mp / "data/d").mkdir()
    for i in range(40):
        (mp / f"data/d/f{i}.txt").write_bytes(b"eager %d" % i)
    assert (mp / "data/d/f7.txt").read_bytes() == b"eager 7"    # read your writes, at once
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    assert sorted(k for k in keys(s3, bucket) if k.startswith("data/d/")) == \
        sorted(f"data/d/f{i}.txt" for i in range(40))
    assert get(s3, bucket, "data/d/f7.txt") == b"eager 7"
    with pytest.raises(OSError) as e:                             # clean: no upload state
        os.getxattr(mp / "data/d/f7.txt", "user.delvefs.upload")
    assert e.value.errno == errno.ENODATA
    shutil.rmtree(mp / "data/d")                                  # unlinks return at once
    assert "d" not in listdir(mp / "data")
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    assert not [k for k in keys(s3, bucket) if k.startswith("data/d/")]
    log = (mounts.tmp / f"cache-{mounts.count}" / "mount.log").read_text()
    assert "DeleteObjects" in log and "DELETE " not in log       # batched, none one by one
    r = mounts.run("sync", str(mounts.tmp))
    assert r.returncode == 1 and "not mounted" in r.stderr


def test_a_close_after_another_writer_changed_the_object_keeps_both(mounts, s3, bucket):
    put(s3, bucket, "data/shared.txt", b"base")
    mp = mounts.mount(data_views(bucket))
    f = open(mp / "data/shared.txt", "r+b")
    f.write(b"mine")
    put(s3, bucket, "data/shared.txt", b"theirs")               # another S3 client
    with pytest.raises(OSError) as e:
        f.close()                                                # If-Match fails: EIO
    assert e.value.errno == errno.EIO
    assert get(s3, bucket, "data/shared.txt") == b"theirs"
    [copy] = conflict_copies(mp / "data", "shared.txt")
    assert (mp / "data" / copy).read_bytes() == b"mine"
    assert os.getxattr(mp / "data" / copy, "user.delvefs.upload").startswith(b"conflict: ")
    assert get(s3, bucket, f"data/{copy}") is None              # never uploaded
    r = mounts.umount(mp)
    assert f"conflict copy left behind (never uploaded): data/{copy}" in r.stderr


def test_a_sigkilled_mount_is_replayed_elsewhere_without_clobbering(mounts, s3, bucket):
    """A mount dies with dirty files; its journal is found by a mount of the same views
    file at another mount point (another cache dir) and replayed conditionally."""
    put(s3, bucket, "data/kept.txt", b"base")
    state = mounts.tmp / "state" / "mounts"
    views = data_views(bucket)
    mp = mounts.mount(views, "--eager", cache_dir=state / "first")
    # both stay open (journaled at the first write that reaches the mount), so that the
    # crash certainly comes before any upload
    kept = os.open(mp / "data/kept.txt", os.O_WRONLY | os.O_APPEND)   # based on "base"
    os.write(kept, b" + mine")
    new = os.open(mp / "data/new.txt", os.O_WRONLY | os.O_CREAT)
    os.write(new, b"journaled, never closed")
    for fd in (kept, new):   # out of the kernel's writeback cache, without fsync (it uploads)
        write_back(fd)
    mounts.kill(mp)
    for fd in (kept, new):
        try:
            os.close(fd)
        except OSError:
            pass
    put(s3, bucket, "data/kept.txt", b"newer, by someone else")
    # the same views file mounted again, elsewhere: the first cache dir is an orphan
    second = mounts.mount_again("elsewhere", state / "second")
    wait_until(lambda: get(s3, bucket, "data/new.txt") == b"journaled, never closed", 60,
               "the orphaned journal's new file uploaded")
    r = mounts.run("sync", str(second))
    assert r.returncode == 1 and "conflict copy" in r.stderr, r.stderr
    assert get(s3, bucket, "data/kept.txt") == b"newer, by someone else"   # not clobbered
    [copy] = conflict_copies(second / "data", "kept.txt")
    assert (second / "data" / copy).read_bytes() == b"base + mine"
    assert os.listdir(state / "first" / "journal") == []         # taken over, once


def test_marker_files_removed_within_the_write_back_delay_cost_no_put_and_no_delete(
        mounts, s3, bucket):
    """A workflow engine's bookkeeping (Snakemake's ``.snakemake/incomplete`` markers):
    each created, closed and removed moments later. With the default write-back delay none
    of them is uploaded or deleted: the mount's own count of its S3 requests shows only the
    files left alone, which reach S3 by themselves once their delay is over."""
    from .test_mount_metrics import Scraper, free_port
    port = free_port()
    mp = mounts.mount(data_views(bucket), "--eager", "--metrics-addr", f"127.0.0.1:{port}")
    scrape = Scraper(port, mp)

    def requests(found, *operations) -> float:
        return sum(scrape.get(found, "delvefs_mount_s3_requests_total", 0, request=op)
                   for op in operations)
    (mp / "data/jobs").mkdir()
    before = scrape()
    for job in range(50):
        marker = mp / f"data/jobs/incomplete-{job}"
        marker.write_bytes(b"")                                  # create + close
        (mp / f"data/jobs/meta-{job}").write_bytes(b'{"job": %d}' % job if job < 5 else b"")
        marker.unlink()
        if job >= 5:
            (mp / f"data/jobs/meta-{job}").unlink()
    assert sorted(listdir(mp / "data/jobs")) == [f"meta-{job}" for job in range(5)]
    # the files left alone: in S3 once their delay is over, without a sync
    wait_until(lambda: sorted(k for k in keys(s3, bucket) if k.startswith("data/jobs/")) ==
               [f"data/jobs/meta-{job}" for job in range(5)], 60, "the metadata files in S3")
    after = scrape()
    assert requests(after, "PutObject") - requests(before, "PutObject") == 5
    assert requests(after, "DeleteObject", "DeleteObjects") == requests(before, "DeleteObject",
                                                                        "DeleteObjects")
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    assert sorted(k for k in keys(s3, bucket) if k.startswith("data/jobs/")) == \
        [f"data/jobs/meta-{job}" for job in range(5)]
    assert get(s3, bucket, "data/jobs/meta-3") == b'{"job": 3}'
    synced = scrape()
    assert requests(synced, "PutObject", "DeleteObject", "DeleteObjects") == \
        requests(after, "PutObject", "DeleteObject", "DeleteObjects")   # nothing was left


# --- fsync: upload (the default) or journal ---

def test_fsync_in_an_eager_mount_uploads_by_default(mounts, s3, bucket):
    mp = mounts.mount(data_views(bucket), "--eager")
    for name, sync in (("fsynced.txt", os.fsync), ("fdatasynced.txt", os.fdatasync)):
        fd = os.open(mp / "data" / name, os.O_WRONLY | os.O_CREAT)
        try:
            os.write(fd, b"in S3 when %s returns" % name.encode())
            sync(fd)                                     # waits for the upload
            assert get(s3, bucket, f"data/{name}") == b"in S3 when %s returns" % name.encode()
        finally:
            os.close(fd)
    r = mounts.run("status", str(mp))
    assert r.returncode == 0 and "writes: eager, fsync=upload" in r.stdout, r.stdout + r.stderr


def test_a_big_file_opened_again_while_its_upload_runs_is_uploaded_once_as_written(
        mounts, s3, bucket):
    # fio lays its file out (created, sized by ftruncate, closed) and opens it again to write
    # it: the background upload begun at the first close gives way to the writer (no
    # failure, no retry delay) and S3 gets what the last close left
    mp = mounts.mount(data_views(bucket), "--eager", "-o", "write_back=0")
    path = mp / "data/big.bin"
    size = 320 << 20                   # 40 parts: the first 10 go at once, the rest as they end
    with open(path, "wb") as f:
        f.truncate(size)

    def state() -> bytes | None:
        try:
            return os.getxattr(path, "user.delvefs.upload")
        except OSError:
            return None
    wait_until(lambda: state() == b"uploading", what="the upload of the first close")
    with open(path, "r+b") as f:                       # opened again while it goes
        f.write(b"second" * 1000)
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    assert get(s3, bucket, "data/big.bin") == b"second" * 1000 + bytes(size - 6000)
    assert state() is None and not conflict_copies(mp / "data", "big.bin")
    log = (mounts.tmp / f"cache-{mounts.count}" / "mount.log").read_text()
    assert " ERROR " not in log and "failed" not in log, log[-2000:]
    assert "data/big.bin given up: written again" in log, log[-2000:]


def journal_records(cache) -> dict[str, dict]:
    """key -> journal record of a mount's cache directory."""
    import json
    records = {}
    for p in sorted((cache / "journal").glob("*.json")):
        r = json.loads(p.read_text())
        records[r["key"]] = r
    return records


def test_fsync_journal_returns_while_s3_is_down_and_a_killed_mount_is_replayed(own):
    """fsync=journal: fsync returns 0 with S3 stopped (fsync=upload would fail with EIO),
    the file and its record are in the cache directory; the mount is SIGKILLed, S3 comes
    back, and the next mount of the same views file (another mount point and cache
    directory: it takes the journal over) uploads it."""
    state = own.tmp / "state" / "mounts"
    data = b"durable before S3 has it " * 400
    mp = own.mount(data_views(own.bucket), "--eager", "-o", "fsync=journal",
                   cache_dir=state / "first")
    listdir(mp / "data")                                 # listed before S3 goes away
    r = own.run("status", str(mp))
    assert "writes: eager, fsync=journal" in r.stdout, r.stdout + r.stderr
    own.svc.minio.stop()
    fd = os.open(mp / "data/durable.bin", os.O_WRONLY | os.O_CREAT)
    os.write(fd, data)
    os.fsync(fd)                                         # 0: the local disk has it
    os.fdatasync(fd)                                     # the same request: 0 as well
    record = journal_records(state / "first")["data/durable.bin"]
    assert (state / "first" / "data" / record["file"]).read_bytes() == data
    own.kill(mp)                                         # before any upload (S3 is down)
    try:
        os.close(fd)
    except OSError:
        pass
    own.svc.minio.start()
    assert get(own.s3, own.bucket, "data/durable.bin") is None
    second = own.mount_again("second", state / "second", "--eager", "-o", "fsync=journal")
    wait_until(lambda: get(own.s3, own.bucket, "data/durable.bin") == data, 120,
               "the journaled file uploaded by the next mount")
    assert (second / "data/durable.bin").read_bytes() == data
    assert journal_records(state / "first") == {}        # taken over, once
