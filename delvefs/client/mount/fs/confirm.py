"""Waiting until the event handler has what this mount wrote (``delvefs sync``).

The S3 store logs each write S3 accepted (:class:`delvefs.client.mount.writelog.WriteLog`).
:meth:`Confirmations.wait` asks the handler that owns each bucket to confirm them
(``POST /v1/objects/wait``, up to 1,000 keys a request, the buckets side by side) and
forgets what it confirmed: after it, a mount started anywhere lists every file this one
wrote and none it removed, whatever the delay between the object store and the handler (a
MinIO queue dir replays its events every few seconds). Bounded by ``timeout``; what is not
confirmed by then is reported, and stays logged for the next sync.
"""
from __future__ import annotations

import logging

import trio

from ...handler.api import HandlerError

log = logging.getLogger(__name__)

CHUNK = 1000       # keys a request (the API's limit)
REPORTED = 20      # keys named in the report of a bucket; the rest are counted


class Confirmations:
    def __init__(self, handler, written):
        self.handler = handler
        self.written = written  # the store's WriteLog

    async def wait(self, timeout: float) -> list[str]:
        """Until the handler has every logged write, at most ``timeout`` seconds; one line
        per write it lacks then (or per bucket it did not answer for)."""
        report: list[str] = []
        deadline = trio.current_time() + timeout

        async def one_bucket(bucket: str, writes: list[dict]) -> None:
            missing: list[dict] = []
            for i in range(0, len(writes), CHUNK):
                chunk = writes[i:i + CHUNK]
                left = max(0.0, deadline - trio.current_time())
                try:
                    pending = await self.handler.wait_objects(bucket, chunk, left)
                except HandlerError as exc:
                    report.append(f"{bucket}: the event handler did not confirm {len(writes) - i} "
                                  f"changes: {exc}")
                    break
                lacking = {p["key"] for p in pending}
                self.written.confirmed(bucket, [w for w in chunk if w["key"] not in lacking])
                missing += pending
            for p in missing[:REPORTED]:
                what = "its delete" if p["etag"] is None else f"version {p['etag']}"
                seen = "none" if p.get("seen") is None else f"version {p['seen']}"
                report.append(f"{bucket}/{p['key']}: the event handler has not seen {what} yet "
                              f"(it has {seen})")
            if len(missing) > REPORTED:
                report.append(f"{bucket}: {len(missing) - REPORTED} more changes not seen by the "
                              "event handler yet")

        unconfirmed = self.written.unconfirmed()
        if unconfirmed:
            log.debug("waiting for the event handler to confirm %d writes",
                      sum(map(len, unconfirmed.values())))
        async with trio.open_nursery() as nursery:
            for bucket, writes in unconfirmed.items():
                nursery.start_soon(one_bucket, bucket, writes)
        return report
