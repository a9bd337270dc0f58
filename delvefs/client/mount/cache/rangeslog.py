"""The ranges log of a sparse written file: the byte ranges that differ from the version it
is based on, kept in memory and in an append-only file of 16-byte records (start, end) beside
the cache file, so that a SIGKILLed mount's next start knows which bytes to send and which to
copy server-side (the record format and when the log is created and removed:
``delvefs.client.mount.fs.written``)."""
from __future__ import annotations

import os
import struct

from .ranges import RangeSet

_RECORD = struct.Struct("<qq")  # one changed range of a ranges log: start, end


class RangesLog:
    """The changed ranges of one sparse dirty entry, in memory and (once ``open``) in its
    append-only log file."""

    __slots__ = ("path", "changed", "fd", "_last")

    def __init__(self, path: str, changed: RangeSet | None = None):
        self.path = path
        self.changed = changed if changed is not None else RangeSet()
        self.fd: int | None = None
        self._last: tuple[int, int, int] | None = None  # (file offset, start, end) of the last record

    def open(self) -> None:
        """Create the log file with the ranges known so far. Raises OSError."""
        if self.fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            data = b"".join(_RECORD.pack(s, e) for s, e in self.changed)
            if data:
                os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._last = None
        if self.changed:
            s, e = list(self.changed)[-1]
            self._last = (len(data) - _RECORD.size, s, e)

    def add(self, start: int, end: int) -> None:
        """Bytes [start, end) were written. Raises OSError (the log file); then nothing
        changed, and it may be called again (a full disk: after making room)."""
        if self.changed.covers(start, end):
            return
        if self.fd is not None:
            last = self._last
            if last is not None and last[1] <= start <= last[2]:  # continues the last record
                at, rec_start, rec_end = last[0], last[1], max(end, last[2])
            else:
                at = os.fstat(self.fd).st_size if last is None else last[0] + _RECORD.size
                rec_start, rec_end = start, end
            if os.pwrite(self.fd, _RECORD.pack(rec_start, rec_end), at) != _RECORD.size:
                raise OSError(28, "short write to the ranges log")
            self._last = (at, rec_start, rec_end)
        self.changed.add(start, end)

    def close(self, remove: bool) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    @staticmethod
    def read(path: str) -> RangeSet | None:
        """The ranges a log holds (a torn last record ignored); None when there is none."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        changed = RangeSet()
        for i in range(0, len(data) - _RECORD.size + 1, _RECORD.size):
            s, e = _RECORD.unpack_from(data, i)
            if 0 <= s < e:
                changed.add(s, e)
        return changed
