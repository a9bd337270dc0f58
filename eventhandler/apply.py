"""The event path (hot, measured by benchmarks/bench_handler_profile.py) and the commit every
writer goes through.

``Committer.finalize`` matches, diffs and commits object records in one WriteBatch for every
writer (events, tag results, time flips, scans, publish batches). ``EventApplier`` applies
what arrives from outside: batches of events, the events held during a first scan, tag
results and due time flips.

Records are lists read through the ``OBJ_*`` constants here: the inner loops run per event,
and a list index is cheaper than any accessor (see records.py)."""
from __future__ import annotations

import logging
import time

from delvefs.shared.manifests import BATCH_FIELD, manifest_batch

from .events import CREATE, REMOVE, TAGGING, Event
from .records import (DELETED, HELD, OBJ_EVER, OBJ_FLAGS, OBJ_LV, OBJ_META, OBJ_SEQ, OBJ_SLOTS,
                      OBJ_TAGS, TAGS_PENDING, UNSETTLED, bits_of, bits_union, change_prefix,
                      held_event, is_deleted, is_settled, is_tags_pending, k_bucket, k_held,
                      k_member, k_obj, k_tagwait, listed_fields_differ, listed_properties,
                      member_properties, new_version, object_info, pack_change, pack_held,
                      pack_member, pack_object, pack_tagwait, pack_version, seq_of, to_match_again,
                      tombstone, unpackb, with_tags, with_tags_unknown)
from .tracking import READY

log = logging.getLogger("delvefs.eventhandler")

CACHE_RECORDS = 200_000
_MISSING = object()


class Committer:
    """The ``committer`` part of ``Engine``: ``finalize`` (call with ``Engine.lock`` held).

    Owns ``cache``, the committed object records by (bucket, key) for the event path only
    (bounded; read by the event applier and the batch publisher, dropped in part or whole
    through ``forget_record`` / ``drop_cache`` by writers that bypass ``finalize``), the memo
    of slot bitmaps and the change listeners. Writes ``BucketState.version``, ``committed``
    and adds to ``groups``. After a commit it starts the tag fetches owed (``tags``),
    schedules time flips (``flips``) and calls the listeners."""

    def __init__(self, store, catalog, tags, flips):
        self.store = store
        self.catalog = catalog
        self.tags = tags
        self.flips = flips
        self.cache: dict[tuple[str, str], list] = {}
        self._bits_memo: dict[tuple, bytes] = {}
        self._listeners = []

    def add_listener(self, fn) -> None:
        """fn(set_of_buckets) is called (from a writer thread) after changes are committed."""
        self._listeners.append(fn)

    def _notify(self, buckets) -> None:
        for fn in self._listeners:
            try:
                fn(buckets)
            except Exception:  # a listener must never break a writer
                log.exception("change listener failed")

    def cached(self, bucket: str, key: str):
        """The committed record of ``key`` (None: gone or never seen); any thread."""
        rec = self.cache.get((bucket, key))
        return rec if rec is not None else self.store.get_object(bucket, key)

    def forget_record(self, bucket: str, key: str) -> None:
        """``key``'s record was written past ``finalize``: the event path reads it anew."""
        self.cache.pop((bucket, key), None)

    def drop_cache(self) -> None:
        """A write past ``finalize`` failed: what the cache holds may not be committed."""
        self.cache.clear()

    def finalize(self, work: dict, log_changes: bool = True, now: float | None = None,
                 extra=None) -> int:
        """Match, diff and write the records in ``work`` ({(bucket,key): [old, new]}; entries
        with new is old are unchanged) in one WriteBatch, with what ``extra(wb)`` adds; then
        publish versions, start the fetches owed, schedule flips and notify. Returns how many
        of the records changed what some view shows (change-log entries written).

        ``_match`` decides which records wait for a fetch; ``_diff`` puts the records, the
        membership index and the change log in the batch; ``_commit`` writes it."""
        now = time.time() if now is None else now
        todo = [(bk, w[0], w[1]) for bk, w in work.items() if w[1] is not w[0]]
        if not todo and not extra:
            return 0
        bitmaps, flips = self._match(todo, now)
        wb, touched, new_groups, logged = self._diff(todo, bitmaps, log_changes)
        self._commit(wb, todo, touched, new_groups, flips, extra, now)
        return logged

    def _match(self, todo: list, now: float) -> tuple[list, list]:
        """(the slots bitmap of each record of ``todo``, the (bucket, key, index) of those
        whose answer can flip with time); sets or clears ``TAGS_PENDING``.

        A record waits for a fetch (``TAGS_PENDING``) in a bucket some view of which reads
        tags or metadata: with unknown metadata that a view reads, or with unknown tags that
        can change its answer (``match_partial``: some view whose other rules it passes
        needs them, and its metadata does not decide), or in a view listing property values
        (``layout_by``) while its tags or metadata are unknown. Every other record is matched
        now; unknown tags stay unknown. Held records (publish.py) are matched by none."""
        catalog = self.catalog
        matcher = catalog.matcher
        tag_buckets, meta_buckets = catalog.tag_buckets, catalog.meta_buckets
        tag_rule_buckets = catalog.tag_rule_buckets
        to_match, objs, partial, partial_objs, held = [], [], [], [], []
        for i, (bk, _old, new) in enumerate(todo):
            flags = new[OBJ_FLAGS]
            if flags & DELETED:
                continue
            if flags & HELD:  # its tags are fetched if a view needs them, it is not matched
                held.append(i)
            if bk[0] in tag_buckets and (new[OBJ_TAGS] is None or new[OBJ_META] is None):
                if new[OBJ_META] is None and bk[0] in meta_buckets:
                    new[OBJ_FLAGS] = flags | TAGS_PENDING
                    continue
                if bk[0] in tag_rule_buckets:
                    partial.append(i)
                    partial_objs.append(object_info(bk[0], bk[1], new))
                    continue
            if flags & TAGS_PENDING:
                new[OBJ_FLAGS] = flags & ~TAGS_PENDING
            if flags & HELD:
                continue
            to_match.append(i)
            objs.append(object_info(bk[0], bk[1], new))
        results = dict(zip(to_match, matcher.match_batch(objs, now))) if objs else {}
        if partial_objs:
            for i, (definite, undecided) in zip(partial, matcher.match_partial_batch(partial_objs, now)):
                new = todo[i][2]
                if undecided:
                    new[OBJ_FLAGS] |= TAGS_PENDING
                else:  # the tags cannot change the answer: leave them unknown
                    new[OBJ_FLAGS] &= ~TAGS_PENDING
                    results[i] = definite
        for i in held:
            results.pop(i, None)
        if catalog.layout_buckets:  # members of views listing property values: tags and metadata first
            listing, layout_buckets = matcher.listing_properties, catalog.layout_buckets
            for i in [i for i in results if todo[i][0][0] in layout_buckets]:
                new = todo[i][2]
                if (new[OBJ_TAGS] is None or new[OBJ_META] is None) and any(s in listing for s in results[i]):
                    new[OBJ_FLAGS] |= TAGS_PENDING
                    del results[i]
        return self._bitmaps(todo, results)

    def _bitmaps(self, todo: list, results: dict) -> tuple[list, list]:
        """``_match``'s answer from ``results`` ({index in ``todo``: the slots of the views
        it is in now}): a record deleted or held is in no view, one waiting for a fetch
        stays in the views it was in."""
        time_buckets = self.catalog.time_buckets
        memo = self._bits_memo
        bitmaps, flips = [], []
        for i, ((bucket, key), old, new) in enumerate(todo):
            flags = new[OBJ_FLAGS]
            if flags & (DELETED | HELD):
                bitmaps.append(b"")
            elif flags & TAGS_PENDING:
                bitmaps.append(old[OBJ_SLOTS] if old is not None else b"")
            else:
                res = results[i]
                t = tuple(res)
                slots = memo.get(t)
                if slots is None:
                    if len(memo) > 4096:
                        memo.clear()
                    slots = memo[t] = bits_of(res)
                bitmaps.append(slots)
                if time_buckets and bucket in time_buckets:
                    flips.append((bucket, key, i))
        return bitmaps, flips

    def _diff(self, todo: list, bitmaps: list, log_changes: bool):
        """A WriteBatch with the records of ``todo`` (their slots: ``bitmaps``), their
        membership entries and their change-log entries; (batch, buckets touched, new groups).

        Membership and change entries of a group with a view listing property values carry
        the record's values of the properties its views list (records.py); a change of them
        is a change (logged) even when nothing else changed. The fourth value: how many
        change-log entries were written."""
        layout_buckets, listed_names = self.catalog.layout_buckets, self.catalog.listed_names
        wb = self.store.batch()
        put, delete = wb.put, wb.delete
        touched: set[str] = set()
        buckets = self.catalog.buckets
        cprefixes: dict = {}
        new_groups = []
        logged = 0
        for ((bucket, key), old, new), slots in zip(todo, bitmaps):
            flags = new[OBJ_FLAGS]
            old_slots = old[OBJ_SLOTS] if old is not None else b""
            new[OBJ_SLOTS] = slots
            ever = new[OBJ_EVER]
            if slots != old_slots and slots != ever:
                ever = new[OBJ_EVER] = bits_union(ever, slots)
            props = None
            props_changed = False
            if layout_buckets and slots and bucket in layout_buckets:
                names = listed_names(slots)
                if names:
                    props, props_changed = self._listed_props(bucket, key, old, new, slots, old_slots, names)
            if log_changes:
                old_deleted = old is None or old[OBJ_FLAGS] & DELETED
                deleted = flags & DELETED
                if slots != old_slots or (slots and (old_deleted or listed_fields_differ(old, new))) \
                        or (deleted and not old_deleted and ever) or props_changed:
                    logged += 1
                    bs = buckets[bucket]
                    v = bs.version = bs.version + 1
                    touched.add(bucket)
                    cprefix = cprefixes.get(bucket)
                    if cprefix is None:
                        cprefix = cprefixes[bucket] = change_prefix(bucket)
                    put(cprefix + pack_version(v), pack_change(key, new, props))
                    if new[OBJ_LV]:
                        delete(cprefix + pack_version(new[OBJ_LV]))
                    new[OBJ_LV] = v
            # the membership index follows slots, size, mtime, etag and props (records.py)
            if slots != old_slots:
                if old_slots:
                    delete(k_member(bucket, old_slots, key))
                if slots and slots not in buckets[bucket].groups:
                    new_groups.append((bucket, slots))
            if slots and (slots != old_slots or props_changed or listed_fields_differ(old, new)):
                put(k_member(bucket, slots, key), pack_member(new, props))
            put(k_obj(bucket, key), pack_object(new))
            if flags & TAGS_PENDING:
                put(k_tagwait(bucket, key), pack_tagwait(new[OBJ_SEQ]))
            elif old is not None and old[OBJ_FLAGS] & TAGS_PENDING:
                delete(k_tagwait(bucket, key))
        return wb, touched, new_groups, logged

    def _commit(self, wb, todo: list, touched: set, new_groups: list, flips: list, extra,
                now: float) -> None:
        """Write ``wb`` (with ``extra``'s writes and the touched buckets' records), publish
        the new versions, then start the fetches owed, schedule flips and notify."""
        buckets = self.catalog.buckets
        if extra:
            extra(wb)
        for b in touched:
            wb.put(k_bucket(b), buckets[b].record())
        # groups before the write: a listing that reads the new version (taken before its
        # groups) must find the new group; an empty one only costs it a seek
        for b, g in new_groups:
            buckets[b].groups = buckets[b].groups | {g}
        try:
            wb.write()
        except BaseException:
            for b in touched:
                buckets[b].version = buckets[b].committed
            self.cache.clear()
            raise
        for b in touched:
            buckets[b].committed = buckets[b].version
        cache = self.cache
        if len(cache) + len(todo) > CACHE_RECORDS:
            cache.clear()
        for bk, _old, new in todo:  # records are never mutated once written
            cache[bk] = new
        # after the commit: tag fetches, time flips, wake-ups
        for (bucket, key), _old, new in todo:
            if new[OBJ_FLAGS] & TAGS_PENDING:
                self.tags.fetch(bucket, key, new)
        if flips:
            self.flips.schedule([(b, k, todo[i][2]) for b, k, i in flips], now)
        if touched:
            self._notify(touched)

    # ---- views listing property values (``layout_by``) ---------------------------------

    def _listed_props(self, bucket, key, old, new, slots, old_slots, names) -> tuple[dict, bool]:
        """(props of ``new`` for group ``slots``, whether they changed) of a record in a group
        with views listing ``names``. A record waiting for its tags (slots unchanged) keeps
        the props its entry has; the old props are read from the entry when the old record
        does not know them (it waited for its tags, or is a new version of an event)."""
        stored = None
        if new[OBJ_FLAGS] & TAGS_PENDING:
            props = stored = stored_props(self.store, bucket, old_slots, key)
        else:
            props = listed_properties(new, names)
        if slots != old_slots:
            return props, False  # logged and filed anew anyway
        if old[OBJ_FLAGS] & UNSETTLED or old[OBJ_TAGS] is None or old[OBJ_META] is None:
            old_props = stored if stored is not None else stored_props(self.store, bucket, old_slots, key)
        else:
            old_props = listed_properties(old, names)
        return props, props != old_props


def stored_props(store, bucket: str, slots: bytes, key: str) -> dict:
    """The props of the membership entry of ``key`` in group ``slots`` ({}: none)."""
    raw = store.get_raw(k_member(bucket, slots, key)) if slots else None
    return (member_properties(unpackb(raw)) or {}) if raw is not None else {}


class EventApplier:
    """The ``applier`` part of ``Engine``: applies what arrives from outside through the
    committer, each under ``Engine.lock``: batches of events (``apply_events``), the events
    held during a bucket's first scan (``replay_held``, for the scanner), tag results (from
    the ``tag-apply`` thread) and due time flips (from the ``flips`` thread). Events of a
    publish batch go to the batch publisher. Writes ``BucketState.held``; owns no other
    state."""

    def __init__(self, lock, store, metrics, catalog, committer, publisher, tags):
        self.lock = lock
        self.store = store
        self.metrics = metrics
        self.catalog = catalog
        self.committer = committer
        self.publisher = publisher
        self.tags = tags

    def apply_events(self, events: list[Event]) -> None:
        """Apply a batch of parsed events in one WriteBatch (call with events in delivery order)."""
        with self.lock:
            self._apply_locked(events)

    def replay_held(self, bucket: str, chunk: int) -> int:
        """Apply (and delete, in the same batch) the oldest ``chunk`` events held for
        ``bucket``; call under the lock. Returns how many."""
        items = self.store.iter_held(bucket, chunk)
        if not items:
            return 0
        events = [held_event(bucket, fields) for _k, fields in items]

        def delete_held(wb):
            for k, _ in items:
                wb.delete(k)
        self._apply_locked(events, replay=True, extra=delete_held)
        return len(items)

    def _apply_locked(self, events: list[Event], replay: bool = False, extra=None) -> None:
        """``replay``: events held during a scan, applied now although the bucket is not
        ready yet; ``extra(wb)`` adds writes to the batch."""
        buckets = self.catalog.buckets
        held = None
        nheld = 0
        cache = self.committer.cache
        get = self.store.get_object
        tag_buckets = self.catalog.tag_buckets
        publisher = self.publisher
        work: dict = {}
        dropped = stale = 0
        applied_seqs = []
        holds = manifests = None  # atomic publish (publish.py): rare, so made when needed
        now = time.time()
        for ev in events:
            bs = buckets.get(ev.bucket)
            if bs is None:
                dropped += 1
                continue
            if bs.state != READY and not replay:
                if held is None:
                    held = self.store.batch()
                bs.held += 1
                held.put(k_held(ev.bucket, bs.held), pack_held(ev))
                nheld += 1
                continue
            batch = manifest_batch(ev.key)
            if batch is not None:  # a publish manifest: no object of any view
                if ev.kind == CREATE:
                    if manifests is None:
                        manifests = []
                    manifests.append((ev, batch))
                continue
            k = (ev.bucket, ev.key)
            w = work.get(k)
            if w is None:
                old = cache.get(k, _MISSING)
                if old is _MISSING:
                    old = get(ev.bucket, ev.key)
                w = work[k] = [old, old]
            cur = w[1]
            kind = ev.kind
            seq = ev.seq
            if kind == REMOVE:
                if cur is not None and seq <= cur[OBJ_SEQ]:
                    stale += 1
                    continue
                w[1] = tombstone(seq, cur)
            elif cur is not None and seq <= cur[OBJ_SEQ]:
                if seq == cur[OBJ_SEQ] and kind == TAGGING and ev.bucket in tag_buckets \
                        and not cur[OBJ_FLAGS] & DELETED:
                    w[1] = with_tags_unknown(cur)
                else:
                    stale += 1
                    continue
            else:  # a newer version (a create, or tagging of a version we never saw)
                w[1] = new_version(cur, seq, ev.size, ev.mtime, ev.etag, None, ev.metadata, 0)
                if kind == CREATE and BATCH_FIELD in ev.metadata:
                    batch = publisher.hold_batch(ev.bucket, ev.metadata, now)
                    if batch is not None:
                        w[1][OBJ_FLAGS] = HELD
                        if holds is None:
                            holds = []
                        holds.append((ev.bucket, batch, ev.key, seq, ev.etag))
            if kind != TAGGING:
                applied_seqs.append(seq)
        if held is not None:
            held.write()
        m = self.metrics
        if dropped:
            m.dropped.inc(dropped)
        if stale:
            m.stale.inc(stale)
        batches = ()
        if holds or manifests:
            batches, batch_writes = publisher.batch_writes(holds or (), manifests or (), now)
            if extra is not None:
                batch_writes = _both(extra, batch_writes)
            extra = batch_writes
        if work or extra:
            self.committer.finalize(work, extra=extra)
            m.processed.inc(len(events) - dropped - nheld)
            now = time.time()
            m.latency.observe_many([now - s / 1e9 for s in applied_seqs if 10**18 <= s <= 4 * 10**18])
        if batches:
            publisher.commit_batches(batches)

    def apply_tag_results(self, items) -> None:
        """Apply fetched (tags, metadata); None for what was not fetched. The committer
        matches the records, or asks for the tags after all when, with the views of now,
        they can change an answer."""
        with self.lock:
            work = {}
            for bucket, key, seq, _ticket, tags, meta in self.tags.claim(items):
                k = (bucket, key)
                w = work.get(k)
                rec = w[1] if w else self.store.get_object(bucket, key)
                if rec is None or seq_of(rec) != seq or is_deleted(rec) or not is_tags_pending(rec):
                    continue
                new = with_tags(rec, tags, meta)
                if w:
                    w[1] = new
                else:
                    work[k] = [rec, new]
            self.committer.finalize(work)
            # held objects of a publish batch: the batch may wait for their tags only
            self.publisher.commit_batches(self.publisher.held_batches(work))

    def apply_flips(self, due, now: float) -> None:
        """Match again the (bucket, key) ``due`` whose answer can flip at ``now``."""
        with self.lock:
            work = {}
            buckets = self.catalog.buckets
            for b, k in due:
                rec = self.store.get_object(b, k) if b in buckets else None
                if rec is None or not is_settled(rec):
                    continue
                work[(b, k)] = [rec, to_match_again(rec)]
            self.metrics.flips.inc(len(work))
            self.committer.finalize(work, now=max(time.time(), now))


def _both(first, second):
    """One ``extra(wb)`` doing both."""
    def both(wb):
        first(wb)
        second(wb)
    return both
