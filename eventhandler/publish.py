"""Atomic directory publish in the handler: objects of a batch are held back from every view
until its manifest and all the objects the manifest names are in, then released in one
commit (one WriteBatch: a client's next listing or delta shows all of them, or none).

What a mount writes is delvefs/shared/manifests.py. Here:

- An object event whose user metadata names a batch (``delvefs-batch``) is *held*: its
  record gets ``HELD`` (in no view; the committer, apply.py) and an ``H`` entry under the batch; the
  batch gets a ``P`` record with its deadline: its creation time (from its id), or when
  the handler first saw it if that is earlier, plus the publish timeout.
- A manifest's event (``PARENT/.delvefs-publish-BATCH``; never an object of any view)
  stores the batch's count and digest in its ``P`` record.
- After either, the batch commits when the held records that are still the versions held
  (same sequencer, not removed or replaced since) are exactly ``count`` objects whose keys
  and ETags give ``digest`` and none waits for its tags: all are released together. A
  manifest therefore releases only the objects it names, with the very ETags it names;
  an object of another writer claiming the batch id keeps the batch from committing
  (until its deadline), it cannot join it.
- At its deadline a batch is dropped: whatever it still holds is *shown* (its objects are
  in S3, where plain S3 clients already see them; a view must not hide them forever),
  with one warning naming the batch, and its ``P`` record goes. A committed batch's record
  is kept until then, so that a copy of one of its objects (which carries the metadata)
  is not held again; an object naming a batch past its deadline is never held.

Everything state-changing here runs under ``Engine.lock`` and commits through the
committer (apply.py); held state is in LevelDB, so a restart or a standby's takeover resumes it.
"""
from __future__ import annotations

import logging
import time

from delvefs.shared import manifests as batch_format

from . import records as r

log = logging.getLogger("delvefs.eventhandler.publish")

DEFAULT_PUBLISH_TIMEOUT = 3600.0
MAX_BATCH = 1_000_000  # a manifest naming more objects is not believed


class BatchPublisher:
    """The ``publisher`` part of ``Engine``: owns ``_batches`` ({(bucket, batch): record
    dict}), the in-memory copy of the ``P`` records (replaced, never changed in place;
    loaded when built). Call with ``Engine.lock`` held unless said."""

    def __init__(self, lock, store, metrics, catalog, committer, background,
                 publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT):
        self.lock = lock
        self.store = store
        self.metrics = metrics
        self.catalog = catalog
        self.committer = committer
        self.background = background
        self.publish_timeout = publish_timeout  # a published batch is shown by then at the latest
        self._batches: dict[tuple[str, str], dict] = store.load_batches()

    def hold_batch(self, bucket: str, metadata: dict, now: float) -> str | None:
        """The batch an object event's record is to be held for, else None."""
        batch = metadata.get(batch_format.BATCH_FIELD)
        if not batch_format.valid_batch(batch):
            return None
        rec = self._batches.get((bucket, batch))
        if rec is not None:
            return None if rec["committed"] or rec["deadline"] <= now else batch
        return batch if min(batch_format.batch_time(batch), now) + self.publish_timeout > now else None

    def batch_writes(self, holds, manifests, now: float):
        """Note held objects (bucket, batch, key, seq, etag) and manifest events; the
        batches touched and a function adding their ``H``/``P`` records to a WriteBatch."""
        touched: set[tuple[str, str]] = set()
        members = []
        for bucket, batch, key, seq, etag in holds:
            self._batch_record(bucket, batch, now)
            members.append((r.k_held_member(bucket, batch, key), r.pack_held_member(seq, etag)))
            touched.add((bucket, batch))
        for ev, batch in manifests:
            meta = ev.metadata
            try:
                count, digest = int(meta.get(batch_format.COUNT_FIELD, "")), meta.get(batch_format.DIGEST_FIELD, "")
            except ValueError:
                count, digest = -1, ""
            if not 0 <= count <= MAX_BATCH or len(digest) != 64 or meta.get(batch_format.BATCH_FIELD) != batch:
                log.warning("manifest %s/%s: unusable metadata %r: ignored", ev.bucket, ev.key, meta)
                continue
            rec = self._batches.get((ev.bucket, batch))
            if rec is None and min(batch_format.batch_time(batch), now) + self.publish_timeout <= now:
                continue  # past its deadline: its objects are shown already
            rec = self._batch_record(ev.bucket, batch, now)
            if rec["committed"] or rec["count"] is not None:
                continue  # a replayed event
            rec["count"], rec["digest"] = count, digest
            touched.add((ev.bucket, batch))

        def write(wb):
            for k, v in members:
                wb.put(k, v)
            for bucket, batch in touched:
                rec = self._batches[(bucket, batch)]
                wb.put(r.k_batch(bucket, batch), r.pack_batch(**rec))
        return touched, write

    def _batch_record(self, bucket: str, batch: str, now: float) -> dict:
        rec = self._batches.get((bucket, batch))
        if rec is None:
            rec = {"deadline": min(batch_format.batch_time(batch), now) + self.publish_timeout,
                   "count": None, "digest": None, "committed": False}
            self._batches = {**self._batches, (bucket, batch): rec}
        return rec

    def _still_held(self, bucket: str, batch: str) -> list[tuple[str, list, bytes]]:
        """(key, record, H key) of the batch's objects that are still the versions held."""
        out = []
        for key, (seq, _etag) in self.store.held_members(bucket, batch):
            rec = self.committer.cached(bucket, key)
            if rec is not None and r.is_held(rec) and r.seq_of(rec) == seq:
                out.append((key, rec, r.k_held_member(bucket, batch, key)))
            else:
                out.append((key, None, r.k_held_member(bucket, batch, key)))
        return out

    def commit_batches(self, batches) -> None:
        """Release every batch of ``batches`` that is complete (see the module)."""
        for bucket, batch in batches:
            rec = self._batches.get((bucket, batch))
            if rec is None or rec["committed"] or rec["count"] is None or bucket not in self.catalog.buckets:
                continue
            members = self._still_held(bucket, batch)
            live = [(key, obj) for key, obj, _ in members if obj is not None]
            if len(live) != rec["count"] or any(r.is_tags_pending(obj) for _, obj in live) or \
                    batch_format.batch_digest((key, r.etag_of(obj)) for key, obj in live) != rec["digest"]:
                continue
            rec = {**rec, "committed": True}
            self._batches = {**self._batches, (bucket, batch): rec}
            self._release(bucket, batch, members, keep=rec)
            self.metrics.publish_committed.inc()
            log.info("published batch %s of bucket %s: %d objects shown together", batch, bucket, len(live))

    def _release(self, bucket: str, batch: str, members, keep: dict | None) -> None:
        """Show the held objects of ``members`` in one commit, delete the batch's ``H``
        entries, and keep its ``P`` record as ``keep`` (None: delete it)."""
        work = {(bucket, key): [obj, r.released(obj)] for key, obj, _ in members if obj is not None}

        def write(wb):
            for _key, _obj, hk in members:
                wb.delete(hk)
            if keep is None:
                wb.delete(r.k_batch(bucket, batch))
            else:
                wb.put(r.k_batch(bucket, batch), r.pack_batch(**keep))
        self.committer.finalize(work, extra=write)

    def held_batches(self, work) -> set[tuple[str, str]]:
        """The batches of the held records among ``work``'s new records."""
        out = set()
        for (bucket, _key), (_old, new) in work.items():
            if new is not None and r.is_held(new):
                batch = (new[r.OBJ_META] or {}).get(batch_format.BATCH_FIELD)
                if batch is not None:
                    out.add((bucket, batch))
        return out

    def expire_batches(self, now: float | None = None) -> int:
        """Drop the batches past their deadline (takes the lock): what they hold is shown.
        Returns how many uncommitted batches were dropped."""
        now = time.time() if now is None else now
        dropped = 0
        buckets = self.catalog.buckets
        with self.lock:
            for (bucket, batch), rec in list(self._batches.items()):
                if rec["deadline"] > now:
                    continue
                batches = dict(self._batches)
                del batches[(bucket, batch)]
                self._batches = batches
                members = self._still_held(bucket, batch) if bucket in buckets else []
                if not rec["committed"]:
                    dropped += 1
                    shown = sum(1 for _, obj, _ in members if obj is not None)
                    log.warning("publish batch %s of bucket %s: %s after %g s (the publish "
                                "timeout): its %d held objects are shown as they are",
                                batch, bucket, "incomplete" if rec["count"] is not None
                                else "no manifest", self.publish_timeout, shown)
                    self.metrics.publish_expired.inc()
                if bucket in buckets:
                    self._release(bucket, batch, members, keep=None)
                else:  # the bucket went with its last view: its records are kept, not its batches
                    wb = self.store.batch()
                    wb.delete(r.k_batch(bucket, batch))
                    for _key, _obj, hk in members:
                        wb.delete(hk)
                    self.store.write(wb)
        return dropped

    def run(self) -> None:
        """The ``publish`` thread: drops the batches past their deadline."""
        interval = max(min(self.publish_timeout / 20, 30.0), 0.05)
        while not self.background.stopping.wait(interval):
            try:
                self.expire_batches()
            except Exception as exc:
                self.background.failed(exc, "dropping expired publish batches")
