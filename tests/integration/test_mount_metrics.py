"""A real mount's Prometheus metrics (``--metrics-addr``, ``--metrics-textfile``), scraped
over HTTP and read from the file while files are read and written through the kernel
(real handler, MinIO, RabbitMQ, FUSE); and the handler's shard in its own metrics."""
from __future__ import annotations

import os
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..waiting import wait_until
from .mounts import data_views, handler, mounts, put  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]

MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parsed(text: str) -> dict[tuple, float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


class Scraper:
    def __init__(self, port: int, mountpoint):
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.mp = str(mountpoint)

    def __call__(self) -> dict[tuple, float]:
        with urllib.request.urlopen(self.url, timeout=30) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
            return parsed(resp.read().decode())

    def get(self, found: dict, name: str, default=None, **labels) -> float:
        return found.get((name, frozenset({"mountpoint": self.mp, **labels}.items())), default)


def read_uncached(path) -> bytes:
    """The file's bytes from the mount, not from the kernel's page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        data = b""
        while chunk := os.read(fd, MiB):
            data += chunk
        return data
    finally:
        os.close(fd)


def test_a_mount_exports_its_requests_cache_uploads_handler_and_views(mounts, s3, bucket, handler, tmp_path):
    body = os.urandom(MiB + 4321)
    put(s3, bucket, "data/big.bin", body)
    put(s3, bucket, "data/small.txt", b"small")
    port = free_port()
    textfile = tmp_path / "textfile" / "delvefs.prom"
    textfile.parent.mkdir()
    # (passthrough off: with it the kernel reads a file whose whole object is cached from the
    # cache file, and the second read below would reach neither READ nor the hit counters)
    mp = mounts.mount(data_views(bucket, ttl=3600), "--metrics-addr", f"127.0.0.1:{port}",
                      "-o", f"metrics_textfile={textfile},metrics_interval=0.2,passthrough=off")
    scrape = Scraper(port, mp)
    get = scrape.get

    before = scrape()
    assert get(before, "delvefs_mount_info", handler=handler.url, version=__import__("delvefs").__version__) == 1
    assert get(before, "delvefs_mount_handler_request_seconds_count", request="register") >= 1
    assert get(before, "delvefs_mount_cache_reads_total", result="miss") == 0

    # a first read waits for S3 (a miss); the same bytes again come from the cache (hits)
    assert read_uncached(mp / "data/big.bin") == body
    first = scrape()
    assert get(first, "delvefs_mount_cache_reads_total", result="miss") >= 1
    assert get(first, "delvefs_mount_cache_fetched_bytes_total") >= len(body)
    assert get(first, "delvefs_mount_cache_gets_total") >= 1
    assert get(first, "delvefs_mount_handler_request_seconds_count", request="list") >= 1
    assert get(first, "delvefs_mount_view_age_seconds", view="data", bucket=bucket) >= 0
    assert get(first, "delvefs_mount_view_stale", view="data", bucket=bucket) == 0
    reads = get(first, "delvefs_mount_fuse_request_seconds_count", op="read")
    assert reads >= 2 and get(first, "delvefs_mount_fuse_errors_total", op="read") == 0
    assert get(first, "delvefs_mount_fuse_request_seconds_bucket", op="read", le="+Inf") == reads
    assert get(first, "delvefs_mount_fuse_request_seconds_count", op="lookup") >= 2

    assert read_uncached(mp / "data/big.bin") == body
    second = scrape()
    hits = get(second, "delvefs_mount_cache_reads_total", result="hit") - get(first, "delvefs_mount_cache_reads_total", result="hit")
    assert hits >= 1
    assert get(second, "delvefs_mount_cache_reads_total", result="miss") == get(first, "delvefs_mount_cache_reads_total", result="miss")
    assert get(second, "delvefs_mount_cache_read_bytes_total", result="hit") - get(
        first, "delvefs_mount_cache_read_bytes_total", result="hit") == len(body)
    assert get(second, "delvefs_mount_cache_fetched_bytes_total") == get(first, "delvefs_mount_cache_fetched_bytes_total")
    assert get(second, "delvefs_mount_fuse_request_seconds_count", op="read") > reads

    # a file written (strict mode: uploaded at close) counts as one upload, none left
    (mp / "data/new.txt").write_bytes(b"written through the mount")
    written = scrape()
    assert get(written, "delvefs_mount_uploads_completed_total") == 1
    assert get(written, "delvefs_mount_fuse_request_seconds_count", op="create") == 1
    assert get(written, "delvefs_mount_fuse_request_seconds_count", op="write") >= 1
    for state in ("pending", "uploading", "failed", "conflict"):
        assert get(written, "delvefs_mount_uploads", state=state) == 0
    assert get(written, "delvefs_mount_conflicts_total") == 0
    assert get(written, "delvefs_mount_dirty_bytes") == 0

    # a name that is not there is answered (a negative entry), not an error
    assert not os.path.exists(mp / "data/nothing-here")
    assert get(scrape(), "delvefs_mount_fuse_errors_total", op="lookup") == 0

    # the textfile: the same metrics, rewritten while the mount runs, gone with it
    def file_shows_the_upload():
        text = textfile.read_text() if textfile.exists() else ""
        return text and get(parsed(text), "delvefs_mount_uploads_completed_total") == 1
    wait_until(file_shows_the_upload, 30, "the metrics file to show the upload")
    assert [p.name for p in textfile.parent.iterdir()] == ["delvefs.prom"]
    mounts.umount(mp)
    assert not textfile.exists()

    # the handler's metrics name its shard ("0": a deployment without shards)
    shard = parsed(handler.http.get("/metrics").text)
    assert shard[("delvefs_handler_info", frozenset({"shard": "0"}.items()))] == 1


def test_a_busy_metrics_address_fails_the_mount_and_leaves_nothing_mounted(mounts, bucket, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        mp = tmp_path / "mnt-busy"
        mp.mkdir()
        r = mounts.run("mount", str(mounts.views(data_views(bucket))), str(mp),
                       "--cache-dir", str(tmp_path / "cache-busy"), "-o", f"metrics_addr=127.0.0.1:{port}")
    assert r.returncode == 1 and f"metrics address 127.0.0.1:{port}" in r.stderr, r.stderr
    from delvefs.client.mount.mountpoints import mounted_fstype
    assert mounted_fstype(str(mp)) is None
