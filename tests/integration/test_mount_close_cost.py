"""What a close costs in S3 requests: kernel mounts whose S3 endpoint is a fault proxy
(delvefs/devtools/faultproxy.py) in front of the real MinIO, with the real RabbitMQ and event
handler; the proxy's log counts every request. A default-mode (close-to-open) close of a small
file is one PutObject — tags and type in its headers, conditional, no `Expect: 100-continue`,
on a kept-alive connection — and a file the views file's `write: {eager: ...}` names closes
without any request, uploaded in the background and waited for by `delvefs sync`."""
from __future__ import annotations

import pytest

from delvefs.devtools.faultproxy import FaultProxy, Request

from .mounts import listdir, mounts, started_handler  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]


def views(bucket: str) -> str:
    # a long ttl: nothing refreshes the listing (no handler request) between the writes
    return f"""
    data:
      bucket: {bucket}
      object: "data/*"
      set: {{stage: raw}}
      ttl: 60s
      write:
        eager: [".snakemake/*", "*.log"]
    """


@pytest.fixture
def proxy(services):
    with FaultProxy.to_url(services.env()["AWS_ENDPOINT_URL"]) as p:
        yield p


@pytest.fixture
def handler(services, service_env, proxy, tmp_path):
    """The handler behind the proxy too: it accepts only proofs (presigned listings) of its
    own endpoint."""
    h = started_handler({**services.env(), "AWS_ENDPOINT_URL": proxy.url}, tmp_path / "handler-state")
    yield h
    h.close()


def store_probe(r: Request) -> bool:
    """The handler's store watch (a ListObjectsV2 of no keys, MinIO's uptime): not the mount's."""
    return (not r.key and "max-keys=0" in r.query) or r.bucket == "minio"


def mount_requests(proxy: FaultProxy, since: float) -> list[Request]:
    return [r for r in proxy.requests(since=since) if not store_probe(r)]


def mount(mounts, proxy, bucket):
    mp = mounts.mount(views(bucket), env={**mounts.env, "AWS_ENDPOINT_URL": proxy.url})
    listdir(mp / "data")  # listed: the handler's scan is done
    return mp


def test_a_default_close_is_one_put_and_so_is_an_overwrite(mounts, proxy, bucket, s3):
    mp = mount(mounts, proxy, bucket)
    (mp / "data" / "warm.txt").write_bytes(b"a first upload opens a connection")
    seen = {r.connection for r in proxy.requests()}

    since = proxy.log[-1].started
    proxy.clear_log()
    (mp / "data" / "out.txt").write_bytes(b"one\n")
    created = mount_requests(proxy, since)
    assert [(r.method, r.key) for r in created] == [("PUT", "data/out.txt")], created
    put = created[0]
    assert put.status == 200 and put.headers.get("if-none-match") == "*"
    assert put.headers.get("x-amz-tagging") == "stage=raw"
    assert put.headers.get("content-type") == "text/plain"
    assert "expect" not in put.headers
    assert put.connection in seen  # kept alive: no new connection, no handshake

    first = s3.head_object(Bucket=bucket, Key="data/out.txt")["ETag"]
    proxy.clear_log()
    (mp / "data" / "out.txt").write_bytes(b"two\n")
    rewritten = mount_requests(proxy, since)
    assert [(r.method, r.key) for r in rewritten] == [("PUT", "data/out.txt")], rewritten
    assert rewritten[0].status == 200
    assert rewritten[0].headers.get("if-match") == first  # on the version the mount wrote
    assert rewritten[0].headers.get("x-amz-tagging") == "stage=raw"  # kept, without asking S3
    assert "expect" not in rewritten[0].headers
    assert s3.get_object(Bucket=bucket, Key="data/out.txt")["Body"].read() == b"two\n"


def test_a_multipart_close_is_create_parts_complete_and_nothing_else(mounts, proxy, bucket, s3):
    mp = mount(mounts, proxy, bucket)
    part = 8 * 1024 * 1024
    data = bytes(range(256)) * ((2 * part + 5) // 256 + 1)
    since = proxy.log[-1].started if proxy.log else 0.0
    proxy.clear_log()
    (mp / "data" / "big.bin").write_bytes(data)
    sent = mount_requests(proxy, since)
    kinds = [(r.method, "partNumber" in r.query and "part" or r.query.partition("=")[0])
             for r in sent]
    assert kinds == [("POST", "uploads")] + [("PUT", "part")] * 3 + [("POST", "uploadId")], sent
    assert sent[-1].headers.get("if-none-match") == "*"
    assert all(r.key == "data/big.bin" and r.status == 200 for r in sent)
    assert not [r for r in sent if "expect" in r.headers]
    assert s3.get_object(Bucket=bucket, Key="data/big.bin")["Body"].read() == data


def test_a_bookkeeping_files_close_returns_before_its_upload_and_sync_uploads_it(
        mounts, proxy, bucket, s3):
    mp = mount(mounts, proxy, bucket)
    (mp / "data" / ".snakemake").mkdir()
    proxy.hold(".snakemake/metadata")    # its PUT, whenever it goes, never gets through
    (mp / "data" / ".snakemake" / "metadata").write_bytes(b'{"job": 1}')   # returned
    assert (mp / "data" / ".snakemake" / "metadata").read_bytes() == b'{"job": 1}'
    (mp / "data" / "out.txt").write_bytes(b"output")     # close-to-open beside it
    assert s3.get_object(Bucket=bucket, Key="data/out.txt")["Body"].read() == b"output"
    with pytest.raises(s3.exceptions.ClientError):
        s3.head_object(Bucket=bucket, Key="data/.snakemake/metadata")
    proxy.pass_through()
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    assert s3.get_object(Bucket=bucket, Key="data/.snakemake/metadata")["Body"].read() \
        == b'{"job": 1}'
