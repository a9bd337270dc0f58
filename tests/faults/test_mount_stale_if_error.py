"""A kernel mount reading cached files while S3 is down (stale-if-error): its S3 endpoint
is a fault proxy (delvefs/devtools/faultproxy.py) in front of the real MinIO, with the
real RabbitMQ and event handler. A file read whole before the outage reads the same bytes
after its ttl with the proxy down and says so in ``user.delvefs.unconfirmed``; with
``-o stale_if_error=off`` such an open fails EIO; once the proxy passes again the next open
confirms the copy and the attribute is gone."""
from __future__ import annotations

import errno
import os

import pytest

from ..waiting import wait_until
from tests.integration.mounts import CHANGE_TIMEOUT, listdir, mounts, put  # noqa: F401  (fixtures)
from .test_write_faults import faulty, handler, proxy  # noqa: F401  (fixtures: S3 behind the proxy)

pytestmark = [pytest.mark.services, pytest.mark.fuse]

UNCONFIRMED = "user.delvefs.unconfirmed"
# the views' ttl is 1 s: the first open after it asks S3; an open refused by the proxy
# costs no timeout, so this only bounds a loaded machine
PAST_TTL = 30.0


def unconfirmed(path) -> str | None:
    try:
        return os.getxattr(path, UNCONFIRMED).decode()
    except OSError as exc:
        assert exc.errno == errno.ENODATA, exc
        return None


def read(path) -> bytes | int:
    """The file's bytes, or the errno its open or read failed with."""
    try:
        return path.read_bytes()
    except OSError as exc:
        return exc.errno


def cached_file(faulty, tmp_path, name: str, data: bytes, *extra):
    """A mount (its own cache directory) that has read ``data/<name>`` whole."""
    put(faulty.s3, faulty.bucket, f"data/{name}", data)
    cache = tmp_path / f"cache-{name}"
    mp = faulty.mount(*extra, cache_dir=cache)
    wait_until(lambda: name in (listdir(mp / "data") or []), CHANGE_TIMEOUT, f"{name} listed")
    path = mp / "data" / name
    assert path.read_bytes() == data
    return path, cache / "mount.log"


def test_a_cached_file_is_read_while_s3_is_down_and_confirmed_when_it_is_back(faulty, proxy,
                                                                              tmp_path):
    data = os.urandom(300 * 1024)
    path, log = cached_file(faulty, tmp_path, "a.bin", data)
    assert unconfirmed(path) is None
    proxy.down()

    def served_unconfirmed():
        assert read(path) == data  # within the ttl from the cache; after it, the same copy
        return unconfirmed(path)
    text = wait_until(served_unconfirmed, PAST_TTL, "an open past the ttl", interval=0.2)
    assert text.startswith("since ") and "S3 could not be asked" in text
    for _ in range(5):          # further opens: served, the attribute kept, logged once
        assert read(path) == data and unconfirmed(path) == text
    assert log.read_text().count("serving it unconfirmed") == 1

    proxy.pass_through()
    assert read(path) == data  # this open's revalidation is answered: the same version
    assert unconfirmed(path) is None
    assert log.read_text().count("S3 answers again about the cached copy") == 1


def test_with_stale_if_error_off_a_cached_file_is_eio_while_s3_is_down(faulty, proxy, tmp_path):
    data = os.urandom(300 * 1024)
    path, log = cached_file(faulty, tmp_path, "b.bin", data, "-o", "stale_if_error=off")
    proxy.down()

    def refused():
        got = read(path)
        assert got in (data, errno.EIO)  # the cached copy only within the ttl
        return got == errno.EIO
    wait_until(refused, PAST_TTL, "an open past the ttl to fail", interval=0.2)
    assert unconfirmed(path) is None
    proxy.pass_through()
    assert read(path) == data
    assert "serving it unconfirmed" not in log.read_text()
