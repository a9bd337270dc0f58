"""The write path under S3 faults: kernel mounts whose S3 endpoint is a fault proxy
(delvefs/devtools/faultproxy.py) in front of the real MinIO, with the real RabbitMQ and
event handler. S3 goes down, slow, or resets connections during strict and eager uploads,
eager batched deletes, multipart uploads, and a journal replay after SIGKILL while
another writer changed the objects. Afterwards every file is in S3 byte-exact or reported
as failed, and nothing was written over a newer version (the proxy's request log and S3's
final content say so)."""
from __future__ import annotations

import errno
import os
import shutil
import threading
import time

import pytest

from delvefs.devtools.faultproxy import FaultProxy, Request

from ..waiting import wait_until
from tests.integration.mounts import listdir, mounts, put, started_handler  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]

PART = 8 * 1024 * 1024              # the mount's multipart threshold and part size
BIG = 3 * PART + 5                  # three parts and a tail
RETRY_WAIT = 60                     # the background retry: 1 s doubling, a few rounds


def views(bucket: str) -> str:
    return f"""
    data:
      bucket: {bucket}
      object: "data/*"
      ttl: 1s
    """


@pytest.fixture
def proxy(services):
    with FaultProxy.to_url(services.env()["AWS_ENDPOINT_URL"], seed=20261123) as p:
        yield p


@pytest.fixture
def handler(services, service_env, proxy, tmp_path):
    """The handler behind the proxy too: it accepts only proofs (presigned listings) of its
    own endpoint. It needs S3 only for first scans and proofs, done before any fault."""
    h = started_handler({**services.env(), "AWS_ENDPOINT_URL": proxy.url}, tmp_path / "handler-state")
    yield h
    h.close()


class Faulty:
    """Mounts whose S3 traffic goes through ``proxy``; short S3 timeouts so that an
    outage costs seconds."""

    def __init__(self, mounts, proxy, bucket, s3):
        self.mounts, self.proxy, self.bucket, self.s3 = mounts, proxy, bucket, s3

    def env(self, attempts: int) -> dict:
        return {**self.mounts.env, "AWS_ENDPOINT_URL": self.proxy.url,
                "DELVEFS_S3_CONNECT_TIMEOUT": "1", "DELVEFS_S3_READ_TIMEOUT": "3",
                "DELVEFS_S3_ATTEMPTS": str(attempts),
                "DELVEFS_SCAN_WAIT": "60"}        # a broken handler fails the test, not hangs it

    def mount(self, *extra, attempts: int = 3, **kwargs):
        mp = self.mounts.mount(views(self.bucket), *extra, env=self.env(attempts), **kwargs)
        listdir(mp / "data")               # listed (the handler's scan done) before faults
        return mp

    def sync(self, mp, timeout: float = 120):
        return self.mounts.run("sync", str(mp), timeout=timeout)

    def get(self, key: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.fixture
def faulty(proxy, mounts, bucket, s3):
    f = Faulty(mounts, proxy, bucket, s3)
    yield f
    proxy.pass_through()                  # so that the mounts' cleanup can flush


def creates(proxy: FaultProxy, key: str, since: float | None = None) -> list[Request]:
    """Answered requests that wrote object ``key``: PutObject, CompleteMultipartUpload,
    CopyObject (not UploadPart, CreateMultipartUpload or tagging)."""
    return [r for r in proxy.requests(key=key, since=since)
            if r.status is not None and 200 <= r.status < 300
            and ((r.method == "PUT" and "uploadId" not in r.query and "tagging" not in r.query)
                 or (r.method == "POST" and "uploadId" in r.query))]


def conflict_copies(directory, name: str) -> list[str]:
    return [n for n in listdir(directory) or [] if n.startswith(f"{name}.conflict-")]


def write(path, data: bytes) -> int | None:
    """Write ``data`` to ``path`` and close it; the errno of a failure (the close's)."""
    try:
        with open(path, "wb") as f:
            for i in range(0, len(data), 1 << 20):
                f.write(data[i:i + (1 << 20)])
    except OSError as exc:
        return exc.errno
    return None


def payload(n: int, seed: int) -> bytes:
    import random
    return random.Random(seed).randbytes(n)


# --- strict mode: close uploads, retries absorb transient faults ---

def test_strict_multipart_upload_survives_reset_parts(faulty, proxy):
    mp = faulty.mount()
    data = payload(BIG, 1)
    proxy.reset(after_bytes=1 << 20, direction="up", limit=2)    # two connections cut mid-part
    err = write(mp / "data/big.bin", data)
    proxy.pass_through()
    assert err in (None, errno.EIO)          # retried in the close, or by the background retry
    wait_until(lambda: faulty.get("data/big.bin") == data, RETRY_WAIT, "big.bin in S3, byte-exact")
    assert proxy.resets == 2
    assert any(r.status is None for r in proxy.requests("PUT", key="data/big.bin"))  # a part was cut
    assert len(creates(proxy, "data/big.bin")) == 1
    assert (mp / "data/big.bin").read_bytes() == data


def test_strict_lost_answers_are_not_conflicts_or_failures(faulty, proxy):
    """S3 carried out the PUT, the answer was lost: the retry must not be refused as a
    conflict with the mount's own upload, nor the close fail.

    Found by this test (write path, conditional uploads): the retried PUT is refused (412:
    S3 has the version the first try wrote), the close fails with EIO and the file's own
    content is set aside as ``f0.txt.conflict-<time>`` although S3 holds exactly that
    content. Reproduction: this test alone (the first new file written after
    ``proxy.reset(direction="down", ...)``)."""
    mp = faulty.mount()
    proxy.reset(direction="down", limit=2)      # the third try of a PUT is answered
    files = {f"data/f{i}.txt": payload(1000 + i, i) for i in range(6)}
    for key, data in files.items():
        assert write(mp / key, data) is None, key
    proxy.pass_through()
    for key, data in files.items():
        assert faulty.get(key) == data, key
        assert conflict_copies(mp / "data", key.split("/")[1]) == []
    assert proxy.resets == 2


def test_strict_s3_down_during_a_multipart_upload_then_back(faulty, proxy):
    mp = faulty.mount(attempts=2)
    data = payload(BIG, 2)
    result = {}
    writer = threading.Thread(target=lambda: result.setdefault("err", write(mp / "data/mp.bin", data)))
    writer.start()
    wait_until(lambda: proxy.requests("PUT", key="data/mp.bin") or "err" in result, 60,
               "the first part under way")
    proxy.down()
    writer.join(60)
    assert not writer.is_alive() and result["err"] in (None, errno.EIO)
    assert (mp / "data/mp.bin").read_bytes() == data               # kept, readable meanwhile
    proxy.slow(latency=0.002, bandwidth=50_000_000)                 # back, but slowly
    wait_until(lambda: faulty.get("data/mp.bin") == data, RETRY_WAIT, "mp.bin in S3, byte-exact")
    assert len(creates(proxy, "data/mp.bin")) == 1


# --- eager mode: close returns at once, `delvefs sync` waits and reports ---

def upload_state(path) -> str | None:
    try:
        return os.getxattr(path, "user.delvefs.upload").decode()
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return None
        raise


def test_eager_uploads_while_s3_is_down_are_reported_then_uploaded(faulty, proxy):
    mp = faulty.mount("--eager", attempts=2)
    proxy.down()
    files = {f"data/e{i}.bin": payload(i * 5000, 10 + i) for i in range(8)}
    files["data/big.bin"] = payload(BIG, 3)
    for key, data in files.items():
        assert write(mp / key, data) is None, key        # safe in the journal: no S3 needed
    assert sorted(listdir(mp / "data")) == sorted(k.split("/")[1] for k in files)
    state = upload_state(mp / "data/e3.bin")
    assert state is not None and state.split(":")[0] in ("waiting", "pending", "uploading",
                                                         "failed"), state
    r = faulty.sync(mp)                                   # S3 down: every file named
    assert r.returncode != 0
    for key in files:
        assert key.split("/")[1] in r.stdout + r.stderr, (key, r.stdout, r.stderr)
    assert faulty.keys() == []
    proxy.slow(latency=0.002, bandwidth=50_000_000)
    r = faulty.sync(mp)
    assert r.returncode == 0, r.stdout + r.stderr
    for key, data in files.items():
        assert faulty.get(key) == data, key
        assert len(creates(proxy, key)) == 1, key
    assert upload_state(mp / "data/e3.bin") is None


def test_eager_uploads_under_random_resets(faulty, proxy):
    mp = faulty.mount("--eager")
    proxy.reset(after_bytes=300, probability=0.3)
    files = {f"data/r/{i:02}.bin": payload(i * 3000, 30 + i) for i in range(30)}
    files["data/r/big.bin"] = payload(BIG, 4)
    os.mkdir(mp / "data/r")
    for key, data in files.items():
        assert write(mp / key, data) is None, key
    faulty.sync(mp)                                       # may name files the resets failed
    proxy.pass_through()
    r = faulty.sync(mp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert faulty.keys("data/r/") == sorted(files)
    for key, data in files.items():
        assert faulty.get(key) == data, key
    assert not any(".conflict-" in n for n in listdir(mp / "data/r"))
    assert proxy.resets > 0


def test_eager_rm_rf_deletes_in_batches_through_outage_and_resets(faulty, proxy, s3):
    keys = sorted(f"data/tree/d{i % 4}/f{i:03}.txt" for i in range(80))
    for k in keys:
        put(s3, faulty.bucket, k, k.encode())
    keep = "data/keep.txt"
    put(s3, faulty.bucket, keep, b"keep")
    mp = faulty.mount("--eager")
    walked = sum(len(files) for _, _, files in os.walk(mp / "data/tree"))
    assert walked == len(keys)
    proxy.down()
    shutil.rmtree(mp / "data/tree")                        # returns at once: journaled
    assert listdir(mp / "data") == ["keep.txt"]
    r = faulty.sync(mp)
    assert r.returncode != 0 and "tree" in r.stdout + r.stderr, r.stdout + r.stderr
    assert faulty.keys("data/tree/") == keys               # nothing deleted yet
    proxy.reset(after_bytes=200, probability=0.5)
    faulty.sync(mp)
    proxy.pass_through()
    r = faulty.sync(mp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert faulty.keys() == [keep] and listdir(mp / "data") == ["keep.txt"]
    batches = [r for r in proxy.requests("POST") if r.query.startswith("delete")]
    singles = [r for r in proxy.requests("DELETE") if r.key.startswith("data/tree/")]
    assert batches and len(batches) + len(singles) < len(keys) // 2, (len(batches), len(singles))


# --- SIGKILL with dirty files; another writer changes and deletes meanwhile ---

@pytest.mark.parametrize("mode", ["strict", "eager"])
def test_journal_replay_after_sigkill_never_overwrites_a_newer_version(faulty, proxy, s3, tmp_path, mode):
    extra = ("--eager",) if mode == "eager" else ()
    put(s3, faulty.bucket, "data/a.txt", b"a, version one")
    put(s3, faulty.bucket, "data/b.txt", b"b, version one")
    cache = tmp_path / "kept-cache"
    mp = faulty.mount(*extra, attempts=2, cache_dir=cache)
    assert (mp / "data/a.txt").read_bytes() == b"a, version one"
    assert (mp / "data/b.txt").read_bytes() == b"b, version one"
    proxy.down()
    mine = {"a.txt": b"a, my local edit", "b.txt": b"b, my local edit", "c.txt": b"c, new here",
            "d.bin": payload(BIG, 5)}
    for name, data in mine.items():
        assert write(mp / "data" / name, data) in (None, errno.EIO), name   # dirty, journaled
    faulty.mounts.kill(mp)
    # meanwhile, another writer: a newer a.txt, b.txt deleted
    s3.put_object(Bucket=faulty.bucket, Key="data/a.txt", Body=b"a, the other writer's version")
    s3.delete_object(Bucket=faulty.bucket, Key="data/b.txt")
    other_done = time.time()
    proxy.pass_through()
    mp = faulty.mount(*extra, cache_dir=cache, mountpoint=mp)
    if mode == "eager":
        faulty.sync(mp)
    wait_until(lambda: faulty.get("data/c.txt") == mine["c.txt"]
               and faulty.get("data/d.bin") == mine["d.bin"], RETRY_WAIT,
               "the journal's new files uploaded")
    wait_until(lambda: conflict_copies(mp / "data", "a.txt"), RETRY_WAIT,
               "the edit of a.txt kept as a conflict copy")
    # the newer version stands; nothing was written to a.txt after it
    assert faulty.get("data/a.txt") == b"a, the other writer's version"
    assert creates(proxy, "data/a.txt", since=other_done) == []
    (copy,) = conflict_copies(mp / "data", "a.txt")
    assert (mp / "data" / copy).read_bytes() == mine["a.txt"]
    # b.txt's edit is not lost: uploaded again, or kept as a conflict copy
    b_copies = conflict_copies(mp / "data", "b.txt")
    assert faulty.get("data/b.txt") == mine["b.txt"] or (
        b_copies and (mp / "data" / b_copies[0]).read_bytes() == mine["b.txt"])
    r = faulty.mounts.umount(mp, check=False)
    assert "conflict" in r.stderr and "a.txt" in r.stderr, r.stderr


@pytest.mark.parametrize("mode", ["strict", "eager"])
def test_slow_s3_delays_writes_and_loses_none(faulty, proxy, mode):
    """S3 50 ms away each way at 20 MB/s: closes (strict) and `delvefs sync` (eager) take
    longer, none fails, and every file lands byte-exact."""
    mp = faulty.mount(*(("--eager",) if mode == "eager" else ()))
    proxy.slow(latency=0.05, bandwidth=20_000_000)
    bodies = {f"data/s{i:02d}": payload(1000 + i * 30_000, i) for i in range(20)}
    for key, body in bodies.items():
        assert write(mp / key, body) is None, key
    assert faulty.sync(mp).returncode == 0
    proxy.pass_through()
    for key, body in bodies.items():
        assert faulty.get(key) == body, key
