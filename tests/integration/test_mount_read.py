"""Kernel mounts made with ``delvefs mount`` against real MinIO, RabbitMQ and the real
event handler (a subprocess): the read path of docs/SEMANTICS.md."""
from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import time

import pytest

from delvefs.client.mount.mountpoints import mounted_fstype

from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, TTL, handler, listdir, mounts, put, tree_views  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]


def test_views_files_and_virtual_directories(mounts, s3, bucket):
    put(s3, bucket, "data/a.txt", b"a", tags={"stage": "raw"})
    put(s3, bucket, "data/sub/b.txt", b"bb")
    put(s3, bucket, "data/sub/deep/c.txt", b"ccc", tags={"stage": "raw"})
    put(s3, bucket, "elsewhere/x.txt", b"x")
    mp = mounts.mount(tree_views(bucket))
    assert sorted(os.listdir(mp)) == ["data", "flat", "raw"]
    assert listdir(mp / "data") == ["a.txt", "sub"]
    assert listdir(mp / "data/sub") == ["b.txt", "deep"]
    assert listdir(mp / "raw") == ["a.txt", "sub"]
    assert listdir(mp / "raw/sub") == ["deep"]
    assert listdir(mp / "flat") == ["a.txt", "sub%2Fb.txt", "sub%2Fdeep%2Fc.txt"]
    st = os.stat(mp / "data/sub/b.txt")
    head = s3.head_object(Bucket=bucket, Key="data/sub/b.txt")
    assert st.st_size == 2 and st.st_uid == os.getuid() and st.st_gid == os.getgid()
    assert int(st.st_mtime) == int(head["LastModified"].timestamp())
    assert os.path.isdir(mp / "data/sub") and not os.path.exists(mp / "data/nope")
    sv = os.statvfs(mp)
    assert sv.f_namemax == 255 and sv.f_bavail > 0
    mounts.umount(mp)
    assert mounted_fstype(str(mp)) is None


def test_put_retag_delete_show_within_ttl(mounts, s3, bucket):
    put(s3, bucket, "data/keep.txt", b"k", tags={"stage": "raw"})
    mp = mounts.mount(tree_views(bucket))
    assert listdir(mp / "raw") == ["keep.txt"]
    # a new object appears (also where a negative entry was cached)
    assert not os.path.exists(mp / "data/new.txt")
    put(s3, bucket, "data/new.txt", b"new", tags={"stage": "raw"})
    wait_until(lambda: os.path.exists(mp / "data/new.txt"), CHANGE_TIMEOUT, "new.txt in data")
    wait_until(lambda: listdir(mp / "raw") == ["keep.txt", "new.txt"], CHANGE_TIMEOUT, "new.txt in raw")
    assert (mp / "data/new.txt").read_bytes() == b"new"
    # retagging moves it out of the tag view only
    s3.put_object_tagging(Bucket=bucket, Key="data/new.txt",
                          Tagging={"TagSet": [{"Key": "stage", "Value": "cooked"}]})
    wait_until(lambda: listdir(mp / "raw") == ["keep.txt"], CHANGE_TIMEOUT, "new.txt leaves raw")
    # the kernel's dentry goes with the (asynchronous) invalidation, at the latest after ttl
    wait_until(lambda: not os.path.exists(mp / "raw/new.txt"), CHANGE_TIMEOUT, "raw/new.txt gone")
    assert os.path.exists(mp / "data/new.txt")
    # deleting removes it everywhere, incl. a virtual directory that becomes empty
    put(s3, bucket, "data/dir/only.txt", b"o")
    wait_until(lambda: os.path.exists(mp / "data/dir/only.txt"), CHANGE_TIMEOUT, "dir/only.txt")
    s3.delete_object(Bucket=bucket, Key="data/new.txt")
    s3.delete_object(Bucket=bucket, Key="data/dir/only.txt")
    wait_until(lambda: listdir(mp / "data") == ["keep.txt"], CHANGE_TIMEOUT, "deletes in data")
    wait_until(lambda: not os.path.exists(mp / "data/new.txt") and not os.path.exists(mp / "data/dir"),
               CHANGE_TIMEOUT, "dentries of deleted names gone")


@pytest.mark.parametrize("name,size", [
    ("empty", 0), ("small.txt", 1234), ("multipart.bin", 20 * 1024 * 1024 + 17),
    ("with space ü ñ 😀.txt", 4321),
])
def test_reads_are_byte_exact(mounts, s3, bucket, name, size):
    data = os.urandom(size)
    put(s3, bucket, f"data/{name}", data)
    mp = mounts.mount(tree_views(bucket))
    assert os.path.getsize(mp / "data" / name) == size
    assert hashlib.sha256((mp / "data" / name).read_bytes()).digest() == hashlib.sha256(data).digest()
    with open(mp / "data" / name, "rb") as f:  # random access: from the cached blocks
        f.seek(size // 2)
        assert f.read(100) == data[size // 2:size // 2 + 100]
    assert (mp / "flat" / name.replace("%", "%25")).read_bytes() == data


def test_changed_object_rereads_after_ttl(mounts, s3, bucket):
    put(s3, bucket, "data/f.txt", b"version one")
    mp = mounts.mount(tree_views(bucket))
    assert (mp / "data/f.txt").read_bytes() == b"version one"
    put(s3, bucket, "data/f.txt", b"version two, longer")
    wait_until(lambda: (mp / "data/f.txt").read_bytes() == b"version two, longer",
               CHANGE_TIMEOUT, "new content")
    assert os.path.getsize(mp / "data/f.txt") == len(b"version two, longer")


def test_changed_before_event_revalidated_by_etag(mounts, s3, bucket, handler):
    """A reopen after ttl checks the ETag with S3 itself, even if no event arrived."""
    put(s3, bucket, "data/f.txt", b"AAAA")
    mp = mounts.mount(tree_views(bucket, ttl=0.5))
    assert (mp / "data/f.txt").read_bytes() == b"AAAA"
    put(s3, bucket, "data/f.txt", b"BBBB")  # same size: only the ETag tells
    wait_until(lambda: (mp / "data/f.txt").read_bytes() == b"BBBB", CHANGE_TIMEOUT, "BBBB")


def test_small_cache_size_evicts_and_reads_stay_correct(mounts, s3, bucket, tmp_path):
    blobs = {f"data/f{i}.bin": os.urandom(700 * 1024) for i in range(6)}
    for key, data in blobs.items():
        put(s3, bucket, key, data)
    mp = mounts.mount(tree_views(bucket), "--cache-size", "2MiB")
    cache = tmp_path / f"cache-{mounts.count}" / "data"
    for _ in range(2):
        for key, data in blobs.items():
            assert (mp / key.replace("data/", "data/", 1)).read_bytes() == data
            # the bytes on disk (cache files are sparse: evicted blocks are holes); the
            # eviction after a fetch may end just after the read returned
            wait_until(lambda: sum(p.stat().st_blocks * 512 for p in cache.iterdir())
                       <= 2 * 1024 * 1024, 10, "the cache within its bound")


def test_xattrs(mounts, s3, bucket):
    put(s3, bucket, "data/x.txt", b"x", tags={"stage": "raw", "worker": "3"}, metadata={"sample": "S1"})
    mp = mounts.mount(tree_views(bucket))
    p = str(mp / "data/x.txt")
    assert os.getxattr(p, "user.stage") == b"raw"
    assert os.getxattr(p, "user.worker") == b"3"
    assert os.getxattr(p, "user.meta.sample") == b"S1"
    assert os.getxattr(p, "user.delvefs.bucket") == bucket.encode()
    assert os.getxattr(p, "user.delvefs.key") == b"data/x.txt"
    etag = s3.head_object(Bucket=bucket, Key="data/x.txt")["ETag"].strip('"')
    assert os.getxattr(p, "user.delvefs.etag") == etag.encode()
    assert set(os.listxattr(p)) == {"user.delvefs.etag", "user.delvefs.bucket", "user.delvefs.key",
                                    "user.stage", "user.worker", "user.meta.sample"}
    with pytest.raises(OSError) as e:
        os.getxattr(p, "user.absent")
    assert e.value.errno == errno.ENODATA


def test_bad_mount_arguments_fail_cleanly(mounts, s3, bucket, tmp_path):
    mp = tmp_path / "mp"
    mp.mkdir()
    good = mounts.views(tree_views(bucket))
    bad = mounts.views("broken:\n  bucket: [unclosed\n")
    cases = [
        (["mount", str(bad), str(mp)], mounts.env, "invalid views file"),
        (["mount", str(good), str(tmp_path / "no-such-dir")], mounts.env, "not an existing directory"),
        (["mount", str(good), str(mp), "--handler", "http://127.0.0.1:9"], mounts.env, "event handler"),
        (["mount", str(good), str(mp)], {**mounts.env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "S3"),
        (["mount", str(good), str(mp), "--cache-size", "lots"], mounts.env, "--cache-size"),
    ]
    for args, env, words in cases:
        r = mounts.run(*args, env=env)
        assert r.returncode != 0, args
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("delvefs mount:") and words in lines[0], r.stderr
        assert mounted_fstype(str(mp)) is None
    # a mountpoint in use
    used = mounts.mount(tree_views(bucket))
    r = mounts.run("mount", str(good), str(used))
    assert r.returncode != 0 and "in use" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert listdir(used) == ["data", "flat", "raw"]  # the first mount is untouched
    r = mounts.run("umount", str(mp))
    assert r.returncode != 0 and "not mounted" in r.stderr


def test_umount_waits_for_daemon(mounts, s3, bucket):
    put(s3, bucket, "data/a", b"a")
    mp = mounts.mount(tree_views(bucket))
    assert (mp / "data/a").read_bytes() == b"a"
    out = subprocess.run(["pgrep", "-f", f"delvefs mount .* {mp} --foreground"],
                         capture_output=True, text=True).stdout.split()
    assert len(out) == 1
    mounts.umount(mp)
    assert not os.path.exists(f"/proc/{out[0]}") or \
        open(f"/proc/{out[0]}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
    assert mounted_fstype(str(mp)) is None


def test_a_handler_that_stops_answering_leaves_a_listed_view_served_not_eio(mounts, handler, s3,
                                                                            bucket):
    """The handler is alive but does not answer (SIGSTOP): once the listing's ttl is over,
    an operation that needs a refresh is answered from the last listing within
    DELVEFS_STALE_AFTER (2 s) — not EIO after DELVEFS_HANDLER_TIMEOUT, not a hang — and the
    view says it is stale; when the handler answers again, so does the mount. (A view never
    listed is EIO after the timeout: tests/core/test_outage.py.)"""
    put(s3, bucket, "data/a", b"x")
    mp = mounts.mount(tree_views(bucket), env={**mounts.env, "DELVEFS_HANDLER_TIMEOUT": "2"})
    wait_until(lambda: listdir(mp / "data") == ["a"], CHANGE_TIMEOUT, "listed")
    listed_at = time.monotonic()
    handler.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: time.monotonic() - listed_at > TTL, 5, "the listing's ttl is over")
        t = time.monotonic()
        assert os.listdir(mp / "data") == ["a"] and time.monotonic() - t < 10
        assert os.getxattr(mp / "data", "user.delvefs.stale").startswith(b"1 since ")
    finally:
        handler.proc.send_signal(signal.SIGCONT)
    # (each listdir after the ttl asks for a refresh; the xattr asks nothing)
    wait_until(lambda: listdir(mp / "data") == ["a"]
               and os.getxattr(mp / "data", "user.delvefs.stale") == b"0", 30, "answers again")
