"""Kept-alive ``http.client`` connections to one host: the pool of both clients that speak
HTTP/1.1 with the standard library — :mod:`delvefs.shared.s3lean` to S3 and
:mod:`delvefs.client.handler.http` to the event handler.

Thread-safe: the idle list changes only under the pool's lock, and a connection taken out
serves one request at a time until it is put back (or closed by its user).
"""
from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading

# what a reused connection the server closed meanwhile raises as a request goes out
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
         ConnectionAbortedError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


class ConnectionPool:
    """Connections to ``host``:``port`` (TLS with ``tls``, a context, when given).
    ``read_timeout``: set on each new connection's socket (None: its user sets one per
    request); ``max_idle``: how many idle ones are kept (None: all)."""

    def __init__(self, host: str, port: int | None, *, tls: ssl.SSLContext | None = None,
                 connect_timeout: float = 5.0, read_timeout: float | None = None,
                 max_idle: int | None = None):
        self.host, self.port, self.tls = host, port, tls
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False
        self.connections_made = 0  # how many this pool opened (tests look at reuse)

    def take(self, *, fresh: bool = False, check: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        """(connection, reused): the most recently used idle one, else a new one (``fresh``:
        always new). ``check``: an idle one the server has closed is dropped first (a poll of
        its socket), not found out by the request. Raises OSError (connecting)."""
        while not fresh:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if not check or still_open(conn):
                return conn, True
            conn.close()
        return self.connect(), False

    def put(self, conn: http.client.HTTPConnection) -> None:
        """A connection whose answer was read to the end: kept for the next request."""
        with self._lock:
            if not self._closed and (self.max_idle is None or len(self._idle) < self.max_idle):
                self._idle.append(conn)
                return
        conn.close()

    def connect(self) -> http.client.HTTPConnection:
        if self.tls is not None:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.connect_timeout,
                                               context=self.tls)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        try:
            conn.connect()
            if self.read_timeout is not None:
                conn.sock.settimeout(self.read_timeout)
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            conn.close()
            raise
        with self._lock:
            self.connections_made += 1
        return conn

    def close(self) -> None:
        """Close the idle connections; those in use are closed when put back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def still_open(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection may carry a request: not closed by the server. An idle
    socket has nothing to read; a readable one is at EOF, failed, or holds bytes nobody
    asked for (TLS: perhaps only a session ticket, which a read takes in)."""
    sock = conn.sock
    if sock is None:
        return False
    poller = select.poll()  # not select.select: descriptors above 1023 are common in a mount
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return True
    if not isinstance(sock, ssl.SSLSocket):
        return False
    sock.setblocking(False)
    try:
        sock.recv(1)  # EOF, or data nobody asked for: either way not to be used again
        return False
    except ssl.SSLWantReadError:
        return True  # TLS records only, no data: still open
    except OSError:
        return False
    finally:
        sock.setblocking(True)
