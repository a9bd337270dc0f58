"""What a running mount reports about itself: the control operation ``status`` (answered
here, inside the mount; ``delvefs status MOUNT`` prints it: delvefs/client/commands/status.py) and the
figures its metrics share (delvefs/client/mount/metrics.py)."""
from __future__ import annotations

import os

from .passthrough import report as passthrough_report

# waiting: closed, in an eager mount's write-back delay (docs/SEMANTICS.md, *Eager mode*);
# pending: to be uploaded as soon as the uploader may
STATES = ("waiting", "pending", "uploading", "failed", "conflict")


def views_report(core) -> list[dict]:
    """Each view and how fresh it is (``refreshed_ago``: seconds since its listing was
    last known current; None until listed)."""
    import trio

    now = trio.current_time()
    views = []
    for vs in core.views:
        li = vs.listing
        fresh = None if not li.listed or li.fresh_at == float("-inf") else round(now - li.fresh_at, 3)
        views.append({"name": vs.name, "bucket": vs.bucket, "root": vs.root, "id": li.id,
                      "listed": li.listed, "version": li.version, "ttl": vs.ttl,
                      "refreshed_ago": fresh, "refreshing": li.refreshing is not None,
                      "stale": li.stale, "stale_since": li.stale_since if li.stale is not None else None,
                      "unshown": len(vs.unshown)})
    return views


def upload_counts(report: list[dict]) -> dict[str, int]:
    """How many files (and DELETEs) of ``core.upload_report()`` are in each state."""
    counts = {state: 0 for state in STATES}
    for f in report:
        counts[f["state"]] = counts.get(f["state"], 0) + 1
    return counts


def dirty_bytes(core) -> int:
    """Bytes of the files written through the mount and not in S3 yet."""
    return sum(e.size for e in core.written.entries())


async def mount_status(core, mountpoint: str, cache_dir, args: dict) -> dict:
    """The control operation ``status`` (served by the mount: delvefs/client/mount/composition.py)."""
    report = core.upload_report()  # files and deletes not in S3 yet (delvefs/client/mount/fs/uploads.py)
    cache = core.cache
    return {"mountpoint": mountpoint, "pid": os.getpid(), "cache_dir": str(cache_dir),
            "handler": core.handler.base_url, "views": views_report(core),
            "files": report, "counts": upload_counts(report),
            "cache": {"bytes": cache.bytes, "limit": cache.limit, "entries": len(cache.entries),
                      "dirty_bytes": dirty_bytes(core)},
            "passthrough": passthrough_report(core),  # delvefs/client/mount/passthrough.py
            "writes": {"eager": core.eager, "fsync": core.settings.fsync}}
