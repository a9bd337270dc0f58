"""``S3Store`` with ``s3.LeanClient`` (DeleteObject, HeadObject, small PutObject
without botocore) against real MinIO: keys, tags and content type as boto3 writes them,
and errors mapped as for botocore's (missing → ENOENT, AccessDenied → EACCES, an
unreachable or silent endpoint → EIO after bounded retries, never a hang). The event
handler's ``BucketReader`` with a LeanClient reads tags and metadata as with boto3."""
from __future__ import annotations

import errno
import json
import socket
import time

import pytest

from delvefs.shared import s3 as s3api
from delvefs.shared.config import S3Settings
from delvefs.client.mount.errors import StoreError
from delvefs.client.mount.s3async import S3Store

pytestmark = [pytest.mark.services, pytest.mark.trio]

KEYS = ["plain.txt", "dir/a b.txt", "a+b%c&d=e?f#g", "ünï/cödé ü.fastq", "~t/semi;colon,comma'q\"<>|\\"]


def store_for(settings: S3Settings, **kw) -> S3Store:
    return S3Store(lambda: s3api.make_client(settings), lean=s3api.LeanClient(settings, **kw))


async def errno_of(coro) -> int:
    with pytest.raises(StoreError) as e:
        await coro
    return e.value.errno


async def test_writes_and_heads_like_boto3(s3, bucket, service_env, tmp_path):
    store = store_for(S3Settings.from_env(service_env))
    body = tmp_path / "body"
    body.write_bytes(b"hello, small world")
    s3.put_object(Bucket=bucket, Key="meta", Body=b"m", Metadata={"Sample": "S1", "x-y": "z"})
    assert await store.head(bucket, "meta") == s3api.head_object(s3, bucket, "meta")
    for key in KEYS:
        info = await store.upload(bucket, key, str(body), size=18, tags={"stage": "raw", "a b": "c+d=e:f/g@h"},
                                  content_type="text/plain")
        assert await store.head(bucket, key) == s3api.head_object(s3, bucket, key)
        assert info["etag"] == s3api.head_object(s3, bucket, key)["etag"]
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"hello, small world"
        assert s3.head_object(Bucket=bucket, Key=key)["ContentType"] == "text/plain"
        tags = {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}
        assert tags == {"stage": "raw", "a b": "c+d=e:f/g@h"}
        await store.delete(bucket, key)
        assert await errno_of(store.head(bucket, key)) == errno.ENOENT
    await store.delete(bucket, "never-was")          # S3 deletes are idempotent
    assert await errno_of(store.delete("no-such-bucket-here", "k")) == errno.EIO  # as botocore's
    store.close()


async def test_access_denied_is_eacces(s3, bucket, service_env, tmp_path):
    # temporary credentials (MinIO STS AssumeRole) whose session policy denies the writes
    import boto3
    s3.put_object(Bucket=bucket, Key="kept", Body=b"k")
    env = service_env
    sts = boto3.client("sts", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                       aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"arn:aws:s3:::{bucket}/*"]},
        {"Effect": "Deny", "Action": ["s3:PutObject", "s3:DeleteObject"],
         "Resource": [f"arn:aws:s3:::{bucket}/*"]}]}
    creds = sts.assume_role(RoleArn="arn:minio:iam:::role/small", RoleSessionName="small", Policy=json.dumps(policy),
                            DurationSeconds=900)["Credentials"]
    settings = S3Settings(env["AWS_ENDPOINT_URL"], creds["AccessKeyId"], creds["SecretAccessKey"],
                          env["AWS_REGION"], creds["SessionToken"])
    store = store_for(settings)
    body = tmp_path / "b"
    body.write_bytes(b"x")
    assert (await store.head(bucket, "kept"))["size"] == 1      # the token is accepted
    assert await errno_of(store.delete(bucket, "kept")) == errno.EACCES
    assert await errno_of(store.upload(bucket, "new", str(body), size=1, tags=None,
                                       content_type=None)) == errno.EACCES
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"k"
    store.close()


async def test_unreachable_and_silent_endpoints_are_eio_in_bounded_time(service_env):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()                                      # nothing listens: refused
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)                                    # accepts, never answers
    try:
        for endpoint in (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{silent.getsockname()[1]}"):
            settings = S3Settings(endpoint, "AK", "SK", "us-east-1")
            store = store_for(settings, attempts=2, connect_timeout=0.5, read_timeout=0.5)
            started = time.monotonic()
            assert await errno_of(store.delete("b", "k")) == errno.EIO
            assert time.monotonic() - started < 4          # 2 tries of <= 0.5 s + <= 1 s backoff
            store.close()
    finally:
        silent.close()


# tag keys and values MinIO stores: spaces, + and =, : / @ (this MinIO refuses what AWS's
# rules refuse — '&', '<', '>', quotes — and non-ASCII letters: tests/unit/test_s3_lean.py
# parses those, escaped, against botocore's parser)
SPECIAL_TAGS = {"a b": "c d", "plus+": "1+1=2", "k=v": "", "s3:q/@": "_.-", "UPPER lower": "x y z"}


async def test_handler_reader_reads_tags_and_metadata_like_boto3(s3, bucket, service_env):
    settings = S3Settings.from_env(service_env)
    lean = s3api.BucketReader.from_settings(settings)
    boto = s3api.BucketReader(lambda: s3api.make_client(settings))
    assert lean._lean is not None and boto._lean is None
    s3.put_object(Bucket=bucket, Key="bare", Body=b"b")
    s3.put_object(Bucket=bucket, Key="meta", Body=b"m", Metadata={"Kind": "K1", "x-y": "z"})
    for key in KEYS:
        s3.put_object(Bucket=bucket, Key=key, Body=b"t")
        s3.put_object_tagging(Bucket=bucket, Key=key, Tagging={
            "TagSet": [{"Key": k, "Value": v} for k, v in SPECIAL_TAGS.items()]})
    for key in KEYS:
        assert lean.tags(bucket, key) == boto.tags(bucket, key) == SPECIAL_TAGS
    assert lean.tags(bucket, "bare") == boto.tags(bucket, "bare") == {}      # an empty tag set
    assert lean.tags(bucket, "gone") is boto.tags(bucket, "gone") is None    # no such object
    assert lean.metadata(bucket, "meta") == boto.metadata(bucket, "meta") == {"kind": "K1", "x-y": "z"}
    assert lean.metadata(bucket, "bare") == boto.metadata(bucket, "bare") == {}
    assert lean.metadata(bucket, "gone") is boto.metadata(bucket, "gone") is None
    assert lean._client is None                          # boto3 was never made for them
    for reader in (lean, boto):                          # a missing bucket is an error, not "gone"
        with pytest.raises(Exception) as e:
            reader.tags("no-such-bucket-here", "k")
        assert s3api.error_code(e.value) == "NoSuchBucket"


async def test_handler_reader_with_wrong_credentials_fails_as_boto3(s3, bucket, service_env):
    s3.put_object(Bucket=bucket, Key="k", Body=b"k", Tagging="kind=k1")
    env = service_env
    for access, secret in ((env["AWS_ACCESS_KEY_ID"], "wrong-secret"), ("no-such-user", "wrong-secret")):
        settings = S3Settings(env["AWS_ENDPOINT_URL"], access, secret, env["AWS_REGION"])
        codes = []
        for reader in (s3api.BucketReader.from_settings(settings),
                       s3api.BucketReader(lambda: s3api.make_client(settings, retries=1))):
            with pytest.raises(Exception) as e:
                reader.tags(bucket, "k")
            codes.append(s3api.error_code(e.value))
        assert codes[0] == codes[1] in ("SignatureDoesNotMatch", "InvalidAccessKeyId"), codes
