"""Which S3 failures say that S3 could not be asked (``StoreError.unreachable``: the
stale-if-error rule of an open serves the cached copy then) and which are S3's answer
about the object; a HEAD asked ``once`` is one try of the lean client."""
from __future__ import annotations

import errno
import socket

import pytest
import trio

from delvefs.client.mount.errors import StoreError, s3_unreachable, store_error
from delvefs.client.mount.s3async import S3Store
from delvefs.shared import s3, s3lean
from delvefs.shared.config import S3Settings

from .test_s3_lean import FakeS3


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("exc,unreachable", [
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), True),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), True),
    (TimeoutError("timed out"), True),
    (OSError(errno.EHOSTUNREACH, "No route to host"), True),
    (s3.S3Error("503", 503, "Service Unavailable"), True),
    (s3.S3Error("InternalError", 500, "We encountered an internal error"), True),
    (s3.S3Error("SlowDown", 503, "Please reduce your request rate"), True),
    (s3.S3Error("400", 400, "Bad Request"), False),
    (OSError(errno.ENOSPC, "No space left on device"), False),
])
def test_what_says_s3_could_not_be_asked(exc, unreachable):
    assert s3_unreachable(exc) is unreachable


@pytest.mark.parametrize("exc,err", [
    (s3.S3Error("404", 404, "Not Found"), errno.ENOENT),
    (s3.S3Error("403", 403, "Forbidden"), errno.EACCES),
    (s3.S3Error("PreconditionFailed", 412, "At least one of the preconditions failed"), errno.EAGAIN),
])
def test_an_answer_about_the_object_is_not_unreachable(exc, err):
    error = store_error(exc, "HEAD b/k")
    assert error.errno == err and not error.unreachable


def test_a_refused_connection_is_an_unreachable_eio():
    error = store_error(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "HEAD b/k")
    assert error.errno == errno.EIO and error.unreachable


def test_a_head_asked_once_is_one_try_of_the_lean_client(monkeypatch):
    monkeypatch.setattr(s3lean.time, "sleep", lambda s: None)  # the backoff, not waited here
    fake = FakeS3([(503, b"", False)] * 4)
    try:
        store = S3Store(lambda: None, lean=s3.LeanClient(fake.settings, attempts=3))

        async def head(once: bool) -> StoreError:
            with pytest.raises(StoreError) as e:
                await store.head("b", "k", once=once)
            return e.value
        error = trio.run(head, True)
        assert error.errno == errno.EIO and error.unreachable and len(fake.seen) == 1
        error = trio.run(head, False)  # the client's tries
        assert error.unreachable and len(fake.seen) == 4
        assert store.requests["HeadObject"] == 2
    finally:
        fake.close()


def test_a_head_to_a_closed_port_is_unreachable_at_once():
    settings = S3Settings(f"http://127.0.0.1:{closed_port()}", "AK", "SECRET", "us-east-1")
    store = S3Store(lambda: None, lean=s3.LeanClient(settings, attempts=3))

    async def head():
        with pytest.raises(StoreError) as e:
            await store.head("b", "k", once=True)
        return e.value
    error = trio.run(head)
    assert error.errno == errno.EIO and error.unreachable
