"""A kernel mount through event handler outages (real handler, MinIO and RabbitMQ): the
handler stopped (SIGSTOP), killed and restarted on its state (SIGKILL), and restarted on
an empty state directory. Throughout, the mount lists its last listing and reads, writes
go to S3, no operation waits for the handler's timeout, and ``user.delvefs.stale`` says
so; objects written through S3 meanwhile show once the handler answers again."""
from __future__ import annotations

import os
import signal
import time

import pytest

from ..conftest import service_unavailable
from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, handler, listdir, mounts, put  # noqa: F401  (fixtures)
from .test_watch import WatchProcess

pytestmark = [pytest.mark.services, pytest.mark.fuse]

TTL = 1.0
HANDLER_TIMEOUT = 20.0  # the mount's default DELVEFS_HANDLER_TIMEOUT
# at most DELVEFS_STALE_AFTER (2 s) for the operations that wait at all: a bound far from
# the timeout, with room for a loaded machine
SERVED_WITHIN = HANDLER_TIMEOUT / 2
CATCH_UP = CHANGE_TIMEOUT + 10.0  # + the backoff between refreshes of a stale view (10 s)


def views(bucket: str) -> str:
    return f"""
    data:
      bucket: {bucket}
      object: "data/*"
      ttl: {TTL}s
    """


def stale(mp) -> str:
    return os.getxattr(mp / "data", "user.delvefs.stale").decode()


def get(s3, bucket, key) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


class Served:
    """``ls`` and ``cat`` of the mount, each timed."""

    def __init__(self, mp):
        self.mp = mp
        self.waits: list[float] = []

    def ls(self) -> list[str] | None:
        t = time.monotonic()
        names = listdir(self.mp / "data")
        self.waits.append(time.monotonic() - t)
        return names

    def cat(self, name: str) -> bytes:
        t = time.monotonic()
        data = (self.mp / "data" / name).read_bytes()
        self.waits.append(time.monotonic() - t)
        return data


def mount_listed(mounts, s3, bucket, tmp_path, **objects):
    for key, body in objects.items():
        put(s3, bucket, f"data/{key}", body)
    cache = tmp_path / "cache-outage"
    mp = mounts.mount(views(bucket), cache_dir=cache)
    wait_until(lambda: listdir(mp / "data") == sorted(objects), CHANGE_TIMEOUT, "the first listing")
    assert stale(mp) == "0"
    return mp, cache / "mount.log"


def test_a_stopped_handler_leaves_the_mount_listing_reading_and_writing(mounts, handler, s3, bucket,
                                                                        tmp_path):
    mp, log = mount_listed(mounts, s3, bucket, tmp_path, a=b"a")
    served = Served(mp)
    handler.proc.send_signal(signal.SIGSTOP)
    try:
        put(s3, bucket, "data/b", b"b")  # held in the handler's queue meanwhile
        (mp / "data/w").write_bytes(b"w")  # through the mount: to S3 at close
        assert get(s3, bucket, "data/w") == b"w"

        def served_stale():
            assert served.ls() == ["a", "w"] and served.cat("a") == b"a"
            return "unreachable" in stale(mp)
        # until a refresh has timed out: the operations meanwhile went on
        wait_until(served_stale, 3 * HANDLER_TIMEOUT, "a refresh to time out", interval=0.2)
        for _ in range(10):              # and after (retries backed off, in the background)
            served_stale()
        assert stale(mp).startswith("1 since ")
        assert max(served.waits) < SERVED_WITHIN, served.waits
    finally:
        handler.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: listdir(mp / "data") == ["a", "b", "w"] and stale(mp) == "0", CATCH_UP,
               "the mount to catch up")
    text = log.read_text()
    assert text.count("view data is stale") == 1 and text.count("view data is fresh again") == 1
    assert "listing again" not in text  # caught up by a delta


def test_a_killed_handler_restarted_on_its_state_is_caught_up_by_delta(mounts, handler, s3, bucket,
                                                                       tmp_path):
    mp, log = mount_listed(mounts, s3, bucket, tmp_path, a=b"a")
    served = Served(mp)
    watch = WatchProcess(mp / "data", mounts.env)
    try:
        handler.kill()
        put(s3, bucket, "data/b", b"b")  # waits in the handler's durable queue
        wait_until(lambda: served.ls() == ["a"] and stale(mp).startswith("1 since "),
                   CHANGE_TIMEOUT, "the view to be stale", interval=0.2)
        assert served.cat("a") == b"a"
        assert "connect" in stale(mp).lower()  # refused at once: no timeout to wait for
        assert max(served.waits) < SERVED_WITHIN, served.waits
        wait_until(lambda: any("event handler unreachable" in line for line in watch.log),
                   CHANGE_TIMEOUT, "watch to say the handler is unreachable")
        assert watch.lines == []         # stdout: paths only

        handler.start()
        wait_until(lambda: listdir(mp / "data") == ["a", "b"] and stale(mp) == "0", CATCH_UP,
                   "the mount to catch up")
        assert (mp / "data/b").read_bytes() == b"b"
        assert watch.wait_lines(1, "the file written meanwhile") == [str(mp / "data/b")]
        wait_until(lambda: any("answers again" in line for line in watch.log), CHANGE_TIMEOUT,
                   "watch to say the handler answers again")
    finally:
        stderr = watch.stop()
    assert sum("event handler unreachable" in line for line in watch.log) == 1, stderr
    text = log.read_text()
    assert text.count("view data is stale") == 1 and text.count("view data is fresh again") == 1
    assert "listing again" not in text  # the change log covered the gap


def test_a_handler_restarted_on_an_empty_state_gets_the_views_again(mounts, handler, services, s3,
                                                                    bucket, tmp_path):
    from eventhandler.devtools import HandlerProcess
    mp, log = mount_listed(mounts, s3, bucket, tmp_path, a=b"a", b=b"b")
    served = Served(mp)
    handler.kill()
    s3.delete_object(Bucket=bucket, Key="data/b")
    put(s3, bucket, "data/c", b"c")
    wait_until(lambda: served.ls() == ["a", "b"] and stale(mp).startswith("1 since "),
               CHANGE_TIMEOUT, "the view to be stale", interval=0.2)
    # the same address, a new state directory: it knows no view and scans the bucket anew
    wiped = HandlerProcess(services.env(), tmp_path / "wiped-state", port=handler.port)
    try:
        try:
            wiped.start()
        except RuntimeError as exc:
            service_unavailable(f"event handler: {exc}")
        wait_until(lambda: served.ls() == ["a", "c"] and stale(mp) == "0", CATCH_UP,
                   "the bucket's current objects", interval=0.2)
        assert served.cat("c") == b"c"
        assert max(served.waits) < SERVED_WITHIN, served.waits
    finally:
        wiped.close()
    text = log.read_text()
    assert text.count("view data is stale") == 1 and text.count("view data is fresh again") == 1
    assert "listing again" in text  # the new handler's versions: the view is listed anew
