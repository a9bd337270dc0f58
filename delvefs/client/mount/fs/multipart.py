"""Parts of a large file uploaded while it is still being written (strict mode).

Once a file being written reaches the store's part size, a multipart upload is started and
every full part that sequential writes have completed is sent in the background, a few at
a time (the writer never waits for S3: a part that finds no free slot waits for the next
write or the close). A write or truncate into a part already sent (or under way) makes it
stale: it is sent again at close. The close then sends only what is missing — the last,
partial part and stale ones — and completes the upload, conditional on the version the
file was based on like any upload. Anything unusual (the key, tags or view changed,
scratch name, a failed part or start) drops the stream: the close uploads the whole file
as before. Only the write path (``delvefs.client.mount.fs.writes``) uses it.
"""
from __future__ import annotations

import logging

import trio

log = logging.getLogger(__name__)

WHILE_WRITING = 10  # parts sent at once while the file is being written


class PartStream:
    """The parts of one dirty entry sent so far (``gens``: the write generation of a part
    when its sending started; ``done``: part -> (gen, length) of parts S3 has)."""

    def __init__(self, store, entry, tags: dict, content_type: str, part_size: int):
        self.entry = entry
        self.key = (entry.bucket, entry.key)
        self.tags = dict(tags)
        self.content_type = content_type
        self.part_size = part_size
        self.mp = store.multipart(entry.bucket, entry.key, tags=tags, content_type=content_type)
        self.part_gen: dict[int, int] = {}     # part -> its write generation
        self.sending: dict[int, int] = {}      # part -> generation being sent
        self.done: dict[int, tuple[int, int, str]] = {}  # part -> (gen, length, ETag)
        self.failed = False
        self.while_writing = WHILE_WRITING
        self.idle = trio.Event()
        self.idle.set()

    def touched(self, start: int, end: int) -> None:
        """Bytes [start, end) changed: the parts they lie in must be sent (again)."""
        p = self.part_size
        for k in range(start // p, max(start, end - 1) // p + 1):
            self.part_gen[k] = self.part_gen.get(k, 0) + 1

    def truncated(self, size: int) -> None:
        p = self.part_size
        for k in list(self.part_gen) + list(self.done):
            if (k + 1) * p > size:
                self.part_gen[k] = self.part_gen.get(k, 0) + 1

    def _current(self, k: int, length: int) -> bool:
        d = self.done.get(k)
        return d is not None and d[:2] == (self.part_gen.get(k, 0), length)

    def pump(self, nursery, written_to: int) -> None:
        """Start sending the full parts below ``written_to`` not sent in their current
        generation, as long as slots are free (never waits)."""
        if self.failed:
            return
        p = self.part_size
        for k in range(min(written_to, self.entry.size) // p):
            # one send of a part at a time: S3 keeps the part that arrived last
            if self._current(k, p) or k in self.sending:
                continue
            # few at once while the writer runs: more threads contend with the request loop
            # for the GIL and slow the writes down more than they speed the upload up
            if len(self.sending) >= self.while_writing or not self.mp.try_slot():
                return
            self._start(nursery, k, p)

    def _start(self, nursery, k: int, length: int) -> None:
        gen = self.part_gen.get(k, 0)
        self.sending[k] = gen
        self.idle = trio.Event() if self.idle.is_set() else self.idle
        nursery.start_soon(self._send, k, gen, length)

    async def _send(self, k: int, gen: int, length: int) -> None:
        try:
            etag = await self.mp.send_part(k + 1, self.entry.path, k * self.part_size, length)
            if etag is None:
                self.failed = True  # the close uploads the whole file
                log.info("%s/%s: a part sent while it was written failed (%s): the close "
                         "uploads the whole file", *self.key, self.mp.errors[-1:])
            else:
                self.done[k] = (gen, length, etag)  # current only while its gen is
        finally:
            if self.sending.get(k) == gen:
                del self.sending[k]
            if not self.sending:
                self.idle.set()

    async def finish(self, nursery, size: int, base: str | None) -> str | None:
        """Close: send what is missing, complete conditional on ``base``; the ETag, or None
        when the stream cannot be used (the caller uploads the whole file). Raises
        StoreError (Changed on a failed condition)."""
        p = self.part_size
        count = max(1, -(-size // p))
        await self.idle.wait()
        for k in range(count):
            if self.failed:
                return None
            length = min(p, size - k * p)
            if not self._current(k, length):
                await self.mp.wait_slot()
                self._start(nursery, k, length)
        await self.idle.wait()
        if self.failed or not all(self._current(k, min(p, size - k * p)) for k in range(count)):
            return None
        return await self.mp.complete(size, base, [self.done[k][2] for k in range(count)])

    async def abort(self) -> None:
        self.failed = True
        with trio.CancelScope(shield=True):
            await self.idle.wait()
            await self.mp.abort()
