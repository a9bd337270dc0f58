"""The write path's errors and large renames through kernel mounts against real
MinIO, RabbitMQ and the real event handler: S3 refusing a mount's requests (AccessDenied,
with temporary credentials from STS AssumeRole and an inline session policy) is EACCES
with one log line naming the object; a cache directory without room gives the errno, the
mount goes on and S3 keeps what it had; a rename above the copy threshold is a multipart
server-side copy."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import resource

import pytest

from ..waiting import wait_until
from .mounts import handler, listdir, mounts, put  # noqa: F401
from .test_mount_write import get, tags_of, write_file, write_views

pytestmark = [pytest.mark.services, pytest.mark.fuse]

MiB = 1024 * 1024


def restricted_env(mounts, bucket: str, deny: list[str]) -> dict:
    """The mounts' environment with temporary credentials (MinIO STS AssumeRole, signed
    with the root keys) that may do anything in ``bucket`` but the ``deny`` actions."""
    import boto3
    env = mounts.env
    sts = boto3.client("sts", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                       aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:*"],
         "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]},
        {"Effect": "Deny", "Action": deny, "Resource": [f"arn:aws:s3:::{bucket}/*"]}]}
    creds = sts.assume_role(RoleArn="arn:minio:iam:::role/delvefs-test",  # MinIO ignores it
                            RoleSessionName="delvefs-test", Policy=json.dumps(policy),
                            DurationSeconds=3600)["Credentials"]
    return {**env, "AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
            "AWS_SESSION_TOKEN": creds["SessionToken"]}


def denied(fn, *args) -> int | None:
    try:
        fn(*args)
    except OSError as exc:
        return exc.errno
    return None


def log_lines(cache, needle: str) -> list[str]:
    return [line for line in (cache / "mount.log").read_text().splitlines() if needle in line]


def test_access_denied_writes_are_eacces_logged_and_data_kept(mounts, s3, bucket, tmp_path):
    put(s3, bucket, "data/a.txt", b"original", tags={"stage": "raw"})
    cache = tmp_path / "denied-cache"
    env = restricted_env(mounts, bucket, ["s3:PutObject", "s3:DeleteObject", "s3:PutObjectTagging"])
    mp = mounts.mount(write_views(bucket), cache_dir=cache, env=env)
    assert (mp / "data/a.txt").read_bytes() == b"original"        # reading is allowed

    # a new file: close(2) uploads, and fails with the upload's error
    assert denied(write_file, mp / "data/new.txt", b"precious") == errno.EACCES
    assert get(s3, bucket, "data/new.txt") is None
    lines = log_lines(cache, f"{bucket}/data/new.txt")
    assert lines and "uploading" in lines[0] and "access denied" in lines[0], lines
    # kept dirty: readable here, and journaled in the cache directory
    assert (mp / "data/new.txt").read_bytes() == b"precious"
    assert "new.txt" in listdir(mp / "data")
    records = [json.loads(p.read_text()) for p in (cache / "journal").glob("*.json")]
    assert [(r["bucket"], r["key"]) for r in records] == [(bucket, "data/new.txt")]

    # unlink, setxattr and rename of an object: refused, nothing changed
    assert denied(os.unlink, mp / "data/a.txt") == errno.EACCES
    assert "a.txt" in listdir(mp / "data") and get(s3, bucket, "data/a.txt") == b"original"
    assert any("deleting" in line and "access denied" in line
               for line in log_lines(cache, f"{bucket}/data/a.txt"))
    assert denied(os.setxattr, mp / "data/a.txt", "user.stage", b"cooked") == errno.EACCES
    assert tags_of(s3, bucket, "data/a.txt") == {"stage": "raw"}
    assert os.getxattr(mp / "data/a.txt", "user.stage") == b"raw"
    assert listdir(mp / "raw") == ["a.txt"] and listdir(mp / "cooked") == []     # not moved
    assert any("tagging" in line and "access denied" in line
               for line in log_lines(cache, f"{bucket}/data/a.txt"))
    assert denied(os.rename, mp / "data/a.txt", mp / "data/b.txt") == errno.EACCES
    assert get(s3, bucket, "data/b.txt") is None and get(s3, bucket, "data/a.txt") == b"original"
    assert "a.txt" in listdir(mp / "data") and "b.txt" not in listdir(mp / "data")
    assert "Traceback" not in (cache / "mount.log").read_text()

    # umount cannot upload it either: said, and kept for the next mount of the cache dir
    r = mounts.umount(mp, check=False)
    assert r.returncode == 1 and "not uploaded" in r.stderr and "data/new.txt" in r.stderr, r.stderr
    assert get(s3, bucket, "data/new.txt") is None
    mounts.mount(write_views(bucket), cache_dir=cache, mountpoint=mp)    # allowed again
    wait_until(lambda: get(s3, bucket, "data/new.txt") == b"precious", 60,
               "the next mount uploads the refused file")


def test_access_denied_read_is_eacces_and_logged(mounts, s3, bucket, tmp_path):
    put(s3, bucket, "data/a.txt", b"secret")
    cache = tmp_path / "denied-cache"
    mp = mounts.mount(write_views(bucket), cache_dir=cache,
                      env=restricted_env(mounts, bucket, ["s3:GetObject"]))
    assert listdir(mp / "data") == ["a.txt"]                       # listing is allowed
    assert os.stat(mp / "data/a.txt").st_size == 6
    assert denied((mp / "data/a.txt").read_bytes) == errno.EACCES
    lines = log_lines(cache, f"{bucket}/data/a.txt")
    assert lines and "access denied" in lines[0], lines


def test_rename_above_copy_threshold_is_a_multipart_copy(mounts, s3, bucket):
    # S3's threshold (5 GiB) made small: the same s3transfer multipart copy, with 5 MiB parts
    env = {**mounts.env, "DELVEFS_COPY_THRESHOLD": str(5 * MiB)}
    data = os.urandom(12 * MiB + 5)
    s3.put_object(Bucket=bucket, Key="data/big.bin", Body=data, Tagging="stage=raw",
                  Metadata={"sample": "S1"}, ContentType="application/x-test")
    assert "-" not in s3.head_object(Bucket=bucket, Key="data/big.bin")["ETag"]
    put(s3, bucket, "data/small.txt", b"small", tags={"stage": "raw"})
    small_etag = s3.head_object(Bucket=bucket, Key="data/small.txt")["ETag"]
    mp = mounts.mount(write_views(bucket), env=env)

    os.rename(mp / "data/big.bin", mp / "data/moved.bin")
    head = s3.head_object(Bucket=bucket, Key="data/moved.bin")
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]    # 3 UploadPartCopy parts
    got = get(s3, bucket, "data/moved.bin")
    assert got is not None and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert get(s3, bucket, "data/big.bin") is None
    assert tags_of(s3, bucket, "data/moved.bin") == {"stage": "raw"}
    assert head["Metadata"] == {"sample": "S1"} and head["ContentType"] == "application/x-test"
    assert listdir(mp / "raw") == ["moved.bin", "small.txt"]
    assert (mp / "data/moved.bin").read_bytes() == data

    # below the threshold: one CopyObject (a single-part copy keeps the content's ETag)
    os.rename(mp / "data/small.txt", mp / "data/small2.txt")
    assert s3.head_object(Bucket=bucket, Key="data/small2.txt")["ETag"] == small_etag
    assert get(s3, bucket, "data/small.txt") is None
    assert tags_of(s3, bucket, "data/small2.txt") == {"stage": "raw"}


def test_a_full_cache_directory_is_an_errno_and_the_mount_goes_on(mounts, s3, bucket):
    """No room in the cache directory (here: the daemon's file size limit, 1 MiB, so writes
    past it fail with EFBIG as they would with ENOSPC on a full disk)."""
    big = os.urandom(3 * MiB)
    put(s3, bucket, "data/big.bin", big)
    put(s3, bucket, "data/small.txt", b"hello")
    mp = mounts.mount(write_views(bucket))
    resource.prlimit(mounts.daemon_pid(mp), resource.RLIMIT_FSIZE, (MiB, resource.RLIM_INFINITY))
    with pytest.raises(OSError) as e:  # its download does not fit
        (mp / "data" / "big.bin").read_bytes()
    assert e.value.errno == errno.EFBIG
    assert (mp / "data" / "small.txt").read_bytes() == b"hello"
    data = os.urandom(2 * MiB)
    with pytest.raises(OSError) as e:
        with open(mp / "data" / "new.bin", "wb") as f:
            f.write(data)
    assert e.value.errno == errno.EFBIG
    # the first MiB that write() accepted is no whole file: never uploaded, dropped at close
    wait_until(lambda: "new.bin" not in listdir(mp / "data"), 20, "the partial file dropped")
    assert get(s3, bucket, "data/new.bin") is None
    assert get(s3, bucket, "data/big.bin") == big  # S3 untouched by the failed read
    resource.prlimit(mounts.daemon_pid(mp), resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    assert (mp / "data" / "big.bin").read_bytes() == big  # room again: read in full
