"""The write path through kernel mounts against real MinIO, RabbitMQ and the
real event handler: round trips, tags, close-to-open, tmp + rename, renames, retagging,
S3 outages, SIGKILL recovery and umount with dirty files."""
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
from .mounts import (CHANGE_TIMEOUT, close_private_stack, data_views, handler, listdir,  # noqa: F401
                     mounts, private_stack, put)

pytestmark = [pytest.mark.services, pytest.mark.fuse]

TTL = 1.0


def write_views(bucket: str, ttl: float = TTL) -> str:
    return data_views(bucket, ttl) + f"""cooked:
      bucket: {bucket}
      object: "data/*"
      properties:
        stage: cooked
      ttl: {ttl}s
    txt:
      bucket: {bucket}
      object: "data/*.txt"
      ttl: {ttl}s
    """


def get(s3, bucket, key) -> bytes | None:
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def tags_of(s3, bucket, key) -> dict:
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}


def keys(s3, bucket) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def write_file(path, data: bytes, chunk: int = 1 << 20) -> None:
    with open(path, "wb") as f:
        for i in range(0, len(data), chunk):
            f.write(data[i:i + chunk])


@pytest.mark.parametrize("name,size", [("empty", 0), ("small.txt", 4321),
                                       ("big.bin", 100 * 1024 * 1024 + 3)])
def test_round_trips_are_byte_exact(mounts, s3, bucket, name, size):
    data = os.urandom(size)
    mp = mounts.mount(write_views(bucket))
    write_file(mp / "raw" / name, data)
    got = get(s3, bucket, f"data/{name}")  # close returned: S3 has it (close-to-open)
    assert got is not None and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert tags_of(s3, bucket, f"data/{name}") == {"stage": "raw"}  # the view's `set`
    assert os.path.getsize(mp / "raw" / name) == size
    assert name in listdir(mp / "raw") and name in listdir(mp / "data")   # at once
    assert hashlib.sha256((mp / "data" / name).read_bytes()).digest() == hashlib.sha256(data).digest()
    if name == "small.txt":
        assert s3.head_object(Bucket=bucket, Key="data/small.txt")["ContentType"] == "text/plain"
        # an existing object opened without O_TRUNC: downloaded, changed in place
        with open(mp / "data" / name, "r+b") as f:
            f.seek(10)
            f.write(b"XYZ")
        assert get(s3, bucket, "data/small.txt") == data[:10] + b"XYZ" + data[13:]


def test_close_to_open_between_two_mounts(mounts, s3, bucket):
    put(s3, bucket, "data/f.txt", b"version one")
    a = mounts.mount(write_views(bucket))
    b = mounts.mount(write_views(bucket))
    assert (b / "data/f.txt").read_bytes() == b"version one"
    (a / "data/f.txt").write_bytes(b"version two, longer")
    assert get(s3, bucket, "data/f.txt") == b"version two, longer"
    assert (a / "data/f.txt").read_bytes() == b"version two, longer"
    wait_until(lambda: (b / "data/f.txt").read_bytes() == b"version two, longer",
               CHANGE_TIMEOUT, "the other mount reads the new version")
    (a / "data/new.txt").write_bytes(b"new")
    wait_until(lambda: os.path.exists(b / "data/new.txt"), CHANGE_TIMEOUT, "new.txt in the other mount")
    assert (b / "data/new.txt").read_bytes() == b"new"
    os.unlink(a / "data/new.txt")
    assert get(s3, bucket, "data/new.txt") is None and "new.txt" not in listdir(a / "data")
    wait_until(lambda: not os.path.exists(b / "data/new.txt"), CHANGE_TIMEOUT, "new.txt gone in b")


def test_tmp_then_rename_leaves_no_junk(mounts, s3, bucket, tmp_path):
    mp = mounts.mount(write_views(bucket))
    # an editor / rsync: write a temporary name the view cannot show, rename it into place
    tmp = mp / "txt" / ".report.txt.XXXXXX"
    tmp.write_bytes(b"draft\n")
    assert tmp.read_bytes() == b"draft\n" and listdir(mp / "txt") == [".report.txt.XXXXXX"]
    assert keys(s3, bucket) == []                                  # scratch: never uploaded
    os.rename(tmp, mp / "txt/report.txt")
    assert get(s3, bucket, "data/report.txt") == b"draft\n"
    assert keys(s3, bucket) == ["data/report.txt"] and listdir(mp / "txt") == ["report.txt"]
    # sort -o into the same view, in place
    (mp / "txt/in.txt").write_bytes(b"c\nb\na\n")
    r = subprocess.run(["sort", "-o", str(mp / "txt/in.txt"), str(mp / "txt/in.txt")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert get(s3, bucket, "data/in.txt") == b"a\nb\nc\n"
    # a scratch file left behind is reported by umount
    (mp / "txt/left.tmp").write_bytes(b"x")
    r = mounts.umount(mp)
    assert "scratch file left behind" in r.stderr and "txt/left.tmp" in r.stderr
    assert keys(s3, bucket) == ["data/in.txt", "data/report.txt"]


def test_rename_files_and_directories(mounts, s3, bucket):
    for k in ["data/d/x.txt", "data/d/e/y.txt", "data/other.txt"]:
        put(s3, bucket, k, k.encode(), tags={"stage": "raw"})
    mp = mounts.mount(write_views(bucket))
    os.rename(mp / "data/other.txt", mp / "data/moved.txt")
    assert get(s3, bucket, "data/moved.txt") == b"data/other.txt"
    assert tags_of(s3, bucket, "data/moved.txt") == {"stage": "raw"}     # copied with its tags
    os.rename(mp / "data/d", mp / "data/n")
    assert keys(s3, bucket) == ["data/moved.txt", "data/n/e/y.txt", "data/n/x.txt"]
    assert listdir(mp / "data") == ["moved.txt", "n"] and listdir(mp / "data/n/e") == ["y.txt"]
    assert (mp / "data/n/e/y.txt").read_bytes() == b"data/d/e/y.txt"
    assert listdir(mp / "raw") == ["moved.txt", "n"]                    # other views at once
    os.mkdir(mp / "data/empty")
    assert listdir(mp / "data") == ["empty", "moved.txt", "n"]
    os.rmdir(mp / "data/empty")
    with pytest.raises(OSError) as e:
        os.link(mp / "data/moved.txt", mp / "data/hard")
    assert e.value.errno == errno.EPERM
    with pytest.raises(OSError) as e:
        os.symlink("moved.txt", mp / "data/sym")
    assert e.value.errno == errno.EPERM
    os.chmod(mp / "data/moved.txt", 0o600)             # accepted, not stored
    os.utime(mp / "data/moved.txt", (1, 1))


def test_setxattr_moves_file_between_views_of_two_mounts(mounts, s3, bucket):
    put(s3, bucket, "data/x", b"x", tags={"stage": "raw"})
    a = mounts.mount(write_views(bucket))
    b = mounts.mount(write_views(bucket))
    assert listdir(b / "raw") == ["x"] and listdir(b / "cooked") == []
    os.setxattr(a / "raw/x", "user.stage", b"cooked")
    assert tags_of(s3, bucket, "data/x") == {"stage": "cooked"}
    assert listdir(a / "raw") == [] and listdir(a / "cooked") == ["x"]   # this mount: at once
    wait_until(lambda: listdir(b / "raw") == [] and listdir(b / "cooked") == ["x"],
               CHANGE_TIMEOUT, "the other mount moves x from raw to cooked")
    assert os.getxattr(b / "cooked/x", "user.stage") == b"cooked"
    with pytest.raises(OSError) as e:
        os.setxattr(a / "cooked/x", "user.delvefs.key", b"k")
    assert e.value.errno == errno.EPERM


def test_view_and_sync_xattrs(mounts, s3, bucket):
    import json
    mp = mounts.mount(write_views(bucket, ttl=3600))
    info = json.loads(os.getxattr(mp / "data", "user.delvefs.view"))
    assert info["name"] == "data" and info["bucket"] == bucket and info["root"] == "data/"
    assert info["layout"] == "tree" and info["handler"].startswith("http://")
    assert "user.delvefs.view" in os.listxattr(mp / "data")
    assert listdir(mp / "data") == []
    put(s3, bucket, "data/late.txt", b"l")

    def handler_version():
        import httpx
        r = httpx.get(f"{info['handler']}/v1/views/{info['id']}/changes",
                      params={"since": info["version"]},
                      headers={"Authorization": f"Bearer {mounts.env['DELVEFS_HANDLER_TOKEN']}"})
        body = r.json()
        assert r.status_code == 200, body
        return body["version"] if body["changes"] else None
    version = wait_until(handler_version, CHANGE_TIMEOUT, "the handler sees late.txt")
    assert listdir(mp / "data") == []                      # ttl 1 h: not asked yet
    os.setxattr(mp / "data", "user.delvefs.sync", str(version).encode())
    assert listdir(mp / "data") == ["late.txt"]


def test_permissions_checked_by_the_mount(mounts, s3, bucket):
    # no default_permissions: the kernel checks no modes (not even for root, as the tests
    # run); the mount refuses writes itself and answers access(2) from the modes it shows
    put(s3, bucket, "data/r.txt", b"r")
    mp = mounts.mount(write_views(bucket) + f"""
    ro:
      bucket: {bucket}
      object: "data/*"
      writable: false
      ttl: {TTL}s
    """)
    assert os.stat(mp / "ro/r.txt").st_mode & 0o777 == 0o444
    assert os.stat(mp / "data/r.txt").st_mode & 0o777 == 0o644
    assert not os.access(mp / "ro/r.txt", os.W_OK) and os.access(mp / "ro/r.txt", os.R_OK)
    assert os.access(mp / "data/r.txt", os.W_OK) and not os.access(mp / "data/r.txt", os.X_OK)
    assert os.access(mp / "ro", os.W_OK | os.X_OK)          # for user.delvefs.sync

    def refused(fn, *args) -> int:
        with pytest.raises(OSError) as e:
            fn(*args)
        return e.value.errno
    assert refused(open, mp / "ro/r.txt", "wb") == errno.EROFS
    assert refused(open, mp / "ro/new.txt", "wb") == errno.EROFS
    assert refused(os.unlink, mp / "ro/r.txt") == errno.EROFS
    assert refused(os.truncate, mp / "ro/r.txt", 0) == errno.EROFS
    assert refused(os.mkdir, mp / "new-dir") == errno.EACCES   # the mount's root
    assert get(s3, bucket, "data/r.txt") == b"r"
    (mp / "data/r.txt").write_bytes(b"w")
    assert get(s3, bucket, "data/r.txt") == b"w"


# --- outages and crashes: services of their own ---

@pytest.fixture
def own(private_services, tmp_path):
    """Private MinIO + RabbitMQ, a handler on them, and mounts (MinIO may be stopped)."""
    m = private_stack(private_services, tmp_path)
    yield m
    close_private_stack(m)


def listed(mp) -> None:
    """Every view listed (the handler's bucket scan done) before S3 goes away."""
    for v in ("data", "raw", "cooked", "txt"):
        listdir(mp / v)


def close_error(path, data) -> tuple[int | None, float]:
    t0 = time.monotonic()
    try:
        write_file(path, data)
    except OSError as exc:
        return exc.errno, time.monotonic() - t0
    return None, time.monotonic() - t0


def test_s3_down_close_fails_data_kept_and_retried(own):
    mp = own.mount(write_views(own.bucket))
    listed(mp)
    own.svc.minio.stop()
    err, took = close_error(mp / "data/f.bin", b"precious" * 1000)
    assert err == errno.EIO and took < 40, (err, took)
    assert (mp / "data/f.bin").read_bytes() == b"precious" * 1000       # kept, readable
    assert listdir(mp / "data") == ["f.bin"]
    own.svc.minio.start()
    wait_until(lambda: get(own.s3, own.bucket, "data/f.bin") == b"precious" * 1000, 120,
               "the background retry uploads f.bin")


def test_umount_uploads_dirty_files_first_and_reports_what_it_cannot(own):
    cache = own.tmp / "shared-cache"
    mp = own.mount(write_views(own.bucket), cache_dir=cache)
    listed(mp)
    own.svc.minio.stop()
    assert close_error(mp / "data/a.bin", b"a" * 100)[0] == errno.EIO
    own.svc.minio.start()
    r = own.umount(mp)                      # uploads a.bin before the daemon exits
    assert get(own.s3, own.bucket, "data/a.bin") == b"a" * 100, r.stderr
    # S3 still down at umount: said, kept, uploaded by the next mount of the cache dir
    mp = own.mount(write_views(own.bucket), cache_dir=cache, mountpoint=mp)
    listed(mp)
    own.svc.minio.stop()
    assert close_error(mp / "data/b.bin", b"b" * 100)[0] == errno.EIO
    r = own.umount(mp, check=False)
    assert r.returncode == 1 and "not uploaded" in r.stderr and "data/b.bin" in r.stderr, r.stderr
    own.svc.minio.start()
    mp = own.mount(write_views(own.bucket), cache_dir=cache, mountpoint=mp)
    wait_until(lambda: get(own.s3, own.bucket, "data/b.bin") == b"b" * 100, 60,
               "the next mount uploads b.bin")


def test_sigkilled_client_dirty_file_uploaded_at_next_mount(mounts, s3, bucket, tmp_path):
    cache = tmp_path / "kept-cache"
    mp = mounts.mount(write_views(bucket), cache_dir=cache)
    fd = os.open(mp / "data/open.bin", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"written, never closed")
    os.kill(mounts.daemon_pid(mp), signal.SIGKILL)
    try:
        os.close(fd)
    except OSError:
        pass
    wait_until(lambda: subprocess.run(["fusermount3", "-u", "-z", str(mp)]).returncode == 0
               or mounted_fstype(str(mp)) is None, 10, "the dead mount is detached")
    mounts.mounted.remove(str(mp))
    assert get(s3, bucket, "data/open.bin") is None
    mp = mounts.mount(write_views(bucket), cache_dir=cache, mountpoint=mp)
    wait_until(lambda: get(s3, bucket, "data/open.bin") == b"written, never closed", 60,
               "the journal's dirty file uploaded")
    assert (mp / "data/open.bin").read_bytes() == b"written, never closed"


def test_sigterm_uploads_dirty_files_before_exit(mounts, s3, bucket):
    from delvefs.client.mount.mountpoints import process_alive
    mp = mounts.mount(write_views(bucket))
    pid = mounts.daemon_pid(mp)
    f = open(mp / "data/open.txt", "wb")
    f.write(b"dirty at SIGTERM")
    f.flush()                                  # in the mount, not uploaded: still open
    assert get(s3, bucket, "data/open.txt") is None
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not process_alive(pid), 60, "the daemon exits")
    try:
        f.close()
    except OSError:
        pass                                   # the mount is gone
    assert get(s3, bucket, "data/open.txt") == b"dirty at SIGTERM"
    assert mounted_fstype(str(mp)) is None
