"""What this mount wrote to S3 that the event handler may not know yet (:class:`WriteLog`).

The S3 store records every write that S3 accepted — an upload or copy with its ETag, a
DELETE as ``None`` — with the wall-clock time its request started. ``delvefs sync`` asks
the handler to confirm them (``POST /v1/objects/wait``) and forgets what it confirmed, so
that a mount started after a sync lists what this one wrote, whatever the delay between
S3 and the handler. Only the newest write of a key counts. The log is bounded: a record
older than ``MAX_AGE`` seconds, or beyond the newest ``MAX_RECORDS``, is forgotten
unconfirmed (the handler normally has it within seconds; a sync after an outage of the
handler longer than that waits for the newer records only).
"""
from __future__ import annotations

import time
from collections import OrderedDict

MAX_AGE = 3600.0
MAX_RECORDS = 200_000


class WriteLog:
    def __init__(self):
        # (bucket, key) -> (ETag or None for a delete, wall-clock start of the request)
        self._writes: OrderedDict[tuple[str, str], tuple[str | None, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._writes)

    def wrote(self, bucket: str, key: str, etag: str | None, since: float) -> None:
        """S3 accepted a write of ``bucket/key`` (``etag``; None: deleted) started at ``since``."""
        k = (bucket, key)
        self._writes.pop(k, None)
        self._writes[k] = (etag, since)
        if len(self._writes) > MAX_RECORDS:
            self._writes.popitem(last=False)

    def unconfirmed(self) -> dict[str, list[dict]]:
        """The writes the handler has not confirmed, by bucket: [{"key", "etag", "since"}]."""
        horizon = time.time() - MAX_AGE
        while self._writes:
            k, (_etag, since) = next(iter(self._writes.items()))
            if since >= horizon:
                break
            del self._writes[k]
        out: dict[str, list[dict]] = {}
        for (bucket, key), (etag, since) in self._writes.items():
            out.setdefault(bucket, []).append({"key": key, "etag": etag, "since": since})
        return out

    def confirmed(self, bucket: str, writes: list[dict]) -> None:
        """The handler has these ``writes`` (as ``unconfirmed`` gave them); a newer write of
        the same key since stays."""
        for w in writes:
            k = (bucket, w["key"])
            if self._writes.get(k) == (w["etag"], w["since"]):
                del self._writes[k]
