"""Batched deletes of an eager mount: an unlink queues its DELETE, sent in DeleteObjects
batches of up to 1,000 keys per bucket once a batch is full or no unlink came for
``delete_gather`` seconds (``rm -r`` sends a few requests, not one per file). A key that
failed is retried with backoff. An upload of a key whose DELETE is still queued sends that
delete first (``settle``): the delete must not remove the new object, nor the old one
fail the upload's condition.
"""
from __future__ import annotations

import errno
import logging
import math
import time

import trio

from ..errors import StoreError

log = logging.getLogger(__name__)


class DeleteQueue:
    """Queued DELETEs, by (bucket, key)."""

    def __init__(self, store, settings):
        self.store = store
        self.gather = settings.delete_gather  # seconds without an unlink before sending
        self.retry_initial = settings.retry_initial
        self.retry_max = settings.retry_max
        self.queued: dict[tuple[str, str], dict] = {}
        self._kick = trio.Event()
        self._sent = trio.Event()  # set (and replaced) after each batch round
        self._now = False          # an upload waits: send without gathering

    def __bool__(self) -> bool:
        return bool(self.queued)

    def each(self) -> list[tuple[tuple[str, str], dict]]:
        """((bucket, key), {"since", "error", ...}) of each queued DELETE (status, sync)."""
        return list(self.queued.items())

    def queue(self, bucket: str, key: str) -> None:
        """Eager unlink: the DELETE is sent by ``run`` in a DeleteObjects batch."""
        self.queued[(bucket, key)] = {"since": time.time(), "at": 0.0, "delay": 0.0,
                                      "error": None}
        self._kick.set()

    async def settle(self, bucket: str, key: str) -> None:
        """Wait until a queued DELETE of ``key`` has been sent (or raise its failure)."""
        while (bucket, key) in self.queued:
            d = self.queued[(bucket, key)]
            if d["error"] is not None and d["at"] > trio.current_time():
                raise StoreError(errno.EIO, f"the DELETE queued before it failed: {d['error']}")
            self._now = True
            self._kick.set()
            await self._sent.wait()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background: send queued DELETEs in batches (see the module)."""
        task_status.started()
        while True:
            kick = self._kick = trio.Event()
            now = trio.current_time()
            due = [k for k, d in self.queued.items() if d["at"] <= now]
            if not due:
                later = [d["at"] for d in self.queued.values()]
                with trio.move_on_at(min(later, default=math.inf)):
                    await kick.wait()
                continue
            if not self._now and len(due) < 1000:
                # gather: more unlinks usually follow (rm -r)
                with trio.move_on_after(self.gather):
                    await kick.wait()
                if self._kick.is_set():
                    continue
            self._now = False
            await self.send()

    async def send_all(self) -> dict[tuple[str, str], str]:
        """Send every queued DELETE now, ignoring backoff (sync, unmount)."""
        for d in self.queued.values():
            d["at"] = 0.0
        return await self.send()

    async def send(self) -> dict[tuple[str, str], str]:
        """Send every due DELETE (batches of 1,000 per bucket, a few at once); the reason of
        each one that failed."""
        now = trio.current_time()
        by_bucket: dict[str, list[tuple[str, dict]]] = {}
        for (bucket, key), d in list(self.queued.items()):
            if d["at"] <= now:
                by_bucket.setdefault(bucket, []).append((key, d))
        failed: dict[tuple[str, str], str] = {}
        limiter = trio.CapacityLimiter(4)

        async def batch(bucket: str, sent: list[tuple[str, dict]]) -> None:
            async with limiter:
                errors = await self.store.delete_many(bucket, [key for key, _ in sent])
            log.info("DeleteObjects %s: %d keys, %d failed", bucket, len(sent), len(errors))
            for key, d in sent:
                # the key may have been queued again while this batch was under way (an
                # object uploaded and unlinked since): that later DELETE is still owed
                current = self.queued.get((bucket, key)) is d
                exc = errors.get(key)
                if exc is None or exc.errno == errno.ENOENT:
                    if current:
                        self.queued.pop((bucket, key))
                    continue
                failed[(bucket, key)] = str(exc)
                if current:
                    log.warning("deleting %s/%s: %s", bucket, key, exc)
                    d["error"] = str(exc)
                    d["delay"] = min(self.retry_max, max(self.retry_initial, d["delay"] * 2))
                    d["at"] = trio.current_time() + d["delay"]
        async with trio.open_nursery() as nursery:
            for bucket, due in by_bucket.items():
                for i in range(0, len(due), 1000):
                    nursery.start_soon(batch, bucket, due[i:i + 1000])
        round_done, self._sent = self._sent, trio.Event()
        round_done.set()
        return failed
