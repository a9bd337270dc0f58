"""Atomic directory publish through kernel mounts, against real MinIO, RabbitMQ and the
event handler: a directory renamed into a view reaches other mounts whole or not at all,
also when the writing mount is SIGKILLed between its uploads and the manifest (the next
mount of its cache directory finishes the publish).

``DELVEFS_TEST_PUBLISH_DIRS`` sets how many directories the polling test publishes (50 by
default; 1000 is the benchmark-scale run)."""
from __future__ import annotations

import os
import subprocess
import threading

import pytest

from delvefs.shared import manifests as batch_format

from ..waiting import wait_until
from .mounts import listdir, mounts, put  # noqa: F401
from tests.faults.test_write_faults import handler, proxy  # noqa: F401  (the handler behind the proxy)

pytestmark = [pytest.mark.services, pytest.mark.fuse]

FILES = ("x.sam", "x.sam.bai", "x.stats")
DIRS = int(os.environ.get("DELVEFS_TEST_PUBLISH_DIRS", "50"))
TIMEOUT = 120


def out_views(bucket: str, ttl: str = "0.05s") -> str:
    """``out``: the samples under out/ (``out/s*``): a directory ``.tmp-s1`` of it is scratch
    (its files are never uploaded) until it is renamed to ``s1``."""
    return f"""
    out:
      bucket: {bucket}
      object: "out/s*"
      writable: true
      ttl: {ttl}
    """


def mount_through(mounts, proxy, bucket, **kw):  # noqa: F811
    env = {**mounts.env, "AWS_ENDPOINT_URL": proxy.url}
    mp = mounts.mount(out_views(bucket), env=env, **kw)
    listdir(mp / "out")  # listed: the handler's first scan is done
    return mp


def write_sample(mp, name: str) -> str:
    """A sample's files written into a scratch directory of ``mp``; its path."""
    tmp = mp / "out" / f".tmp-{name}"
    tmp.mkdir()
    for f in FILES:
        (tmp / f).write_bytes(f"{name}/{f}\n".encode() * 100)
    return str(tmp)


class Subscriber:
    """Polls a mount's ``out`` view as fast as it can in a thread, keeping every sample
    directory it ever saw with a strict subset of its files."""

    def __init__(self, mp):
        self.out = mp / "out"
        self.complete: set[str] = set()
        self.partial: list[tuple[str, list[str]]] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name in listdir(self.out) or ():
                if name in self.complete:
                    continue  # a published directory never loses files
                files = listdir(self.out / name)
                if files == sorted(FILES):
                    self.complete.add(name)
                elif files:
                    self.partial.append((name, files))
            self.polls += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.timeout(300 + DIRS)
def test_a_subscriber_never_sees_part_of_a_published_directory(mounts, proxy, bucket):  # noqa: F811
    writer = mount_through(mounts, proxy, bucket)
    reader = mount_through(mounts, proxy, bucket)
    names = [f"s{i:04d}" for i in range(DIRS)]
    tmps = [write_sample(writer, n) for n in names]
    sub = Subscriber(reader)
    try:
        for tmp, name in zip(tmps, names):
            os.rename(tmp, writer / "out" / name)
        wait_until(lambda: len(sub.complete) == DIRS, TIMEOUT + DIRS / 2,
                   f"the subscriber sees all {DIRS} directories")
    finally:
        sub.stop()
    assert sub.partial == [], f"seen partly ({len(sub.partial)} times): {sub.partial[:5]}"
    assert sub.polls > DIRS  # it did poll while they came


def test_a_mount_killed_before_the_manifest_publishes_at_its_next_mount(mounts, proxy, bucket,  # noqa: F811
                                                                        s3, tmp_path):
    cache = tmp_path / "writer-cache"
    writer = mount_through(mounts, proxy, bucket, cache_dir=cache)
    reader = mount_through(mounts, proxy, bucket)
    tmp = write_sample(writer, "s1")
    proxy.hold(batch_format.MANIFEST_NAME)  # the manifest's PUT never gets out
    mv = subprocess.Popen(["mv", tmp, str(writer / "out" / "s1")], stderr=subprocess.PIPE)
    try:
        wait_until(lambda: proxy.requests("PUT", since=None) and any(
            batch_format.MANIFEST_NAME in r.key for r in proxy.requests("PUT")), TIMEOUT,
            "the manifest's PUT (after the uploads)")
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/s1/")["Contents"])
        assert keys == [f"out/s1/{f}" for f in FILES]  # plain S3 sees them: dual access

        def shown_after(marker: str) -> list[str]:
            # a later ordinary object shows: the reader's view is past the batch's events
            put(s3, bucket, f"out/{marker}", b"m")
            wait_until(lambda: marker in (listdir(reader / "out") or []), TIMEOUT, f"{marker} shown")
            return listdir(reader / "out")
        assert "s1" not in shown_after("s-marker1")
        mounts.kill(writer)
    finally:
        proxy.pass_through()
        mv.wait(60)
    assert mv.returncode != 0
    assert "s1" not in shown_after("s-marker2")
    mounts.mount(out_views(bucket), env={**mounts.env, "AWS_ENDPOINT_URL": proxy.url},
                 cache_dir=cache, mountpoint=writer)
    wait_until(lambda: listdir(reader / "out" / "s1") == sorted(FILES), TIMEOUT,
               "the next mount writes the manifest: all of s1 shows")
    assert (reader / "out" / "s1" / "x.stats").read_bytes() == b"s1/x.stats\n" * 100
    assert not any(batch_format.MANIFEST_NAME in o["Key"]
                   for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_any_s3_client_publishes_with_a_manifest(mounts, proxy, bucket, s3):  # noqa: F811
    """docs/API.md's example: objects with the batch's metadata, then the manifest."""
    import time
    reader = mount_through(mounts, proxy, bucket)
    batch = batch_format.new_batch(time.time())
    items = []
    for name in ("s1.bam", "s1.bam.bai"):
        r = s3.put_object(Bucket=bucket, Key=f"out/s1/{name}", Body=name.encode(),
                          Metadata={batch_format.BATCH_FIELD: batch})
        items.append((f"out/s1/{name}", r["ETag"].strip('"')))
    put(s3, bucket, "out/s-marker", b"m")  # after the batch's objects: the reader is past them
    wait_until(lambda: "s-marker" in (listdir(reader / "out") or []), TIMEOUT, "the marker shown")
    assert "s1" not in listdir(reader / "out")
    manifest = batch_format.manifest_key("out/", batch)
    s3.put_object(Bucket=bucket, Key=manifest, Body=b"", Metadata=batch_format.manifest_metadata(batch, items))
    s3.delete_object(Bucket=bucket, Key=manifest)
    wait_until(lambda: listdir(reader / "out" / "s1") == ["s1.bam", "s1.bam.bai"], TIMEOUT,
               "both shown once the manifest is in")


def test_a_directory_of_objects_renamed_is_copied_with_its_batch(mounts, proxy, bucket, s3):  # noqa: F811
    """Objects already in S3 move by CopyObject, with the batch's metadata added to theirs."""
    for f in FILES:
        s3.put_object(Bucket=bucket, Key=f"out/s5/{f}", Body=f.encode(), Metadata={"sample": "s5"})
    writer = mount_through(mounts, proxy, bucket)
    reader = mount_through(mounts, proxy, bucket)
    wait_until(lambda: listdir(writer / "out" / "s5") == sorted(FILES), TIMEOUT, "s5 listed")
    os.rename(writer / "out" / "s5", writer / "out" / "s6")
    wait_until(lambda: listdir(reader / "out") == ["s6"] and listdir(reader / "out" / "s6") == sorted(FILES),
               TIMEOUT, "s6 shown whole, s5 gone")
    heads = [s3.head_object(Bucket=bucket, Key=f"out/s6/{f}") for f in FILES]
    assert len({h["Metadata"][batch_format.BATCH_FIELD] for h in heads}) == 1
    assert all(h["Metadata"]["sample"] == "s5" for h in heads)  # their own metadata stays
    assert (reader / "out" / "s6" / "x.stats").read_bytes() == b"x.stats"
