"""Work-queue groups: each file that appears in a view goes to exactly one live member of
the group (docs/SEMANTICS.md, "Work-queue groups"; the HTTP side is eventhandler/api/groups.py).

A group is named per view and lives in LevelDB (records.py, ``G`` and ``W``), so it
survives a restart of the handler and a standby's takeover. The handler feeds it from the
view's change log, the same log the change stream reads: the group's ``cursor`` is the
version up to which every file of the view was given a ``W`` record (written in one
WriteBatch with the records). A file is

- *pending* until a member claims it;
- *in flight* while the member holds its lease (``lease`` seconds, renewed while it works);
  when the lease runs out the attempt failed and the file is pending again; a member that
  leaves, or gives the file back without working on it (its mount could not show it), makes
  it pending again without counting the attempt;
- *done* when the member acknowledged it;
- *failed* (set aside) when ``max_failures`` attempts failed: reported failures and lapsed
  leases alike.

Everything here runs on the API's asyncio loop (one thread), so each operation is atomic
against the others; a page of the change log is read on it as the change stream reads
one, a whole listing off it (:func:`read_news`), and applied on it (:meth:`WorkGroup.feed`).
"""
from __future__ import annotations

import asyncio
import re
import time
from collections import deque

from . import records as r

NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
MEMBER = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
DEFAULT_LEASE = 60.0
DEFAULT_MAX_FAILURES = 3
LEASE_RANGE = (0.5, 86400.0)
MAX_FAILURES_RANGE = (1, 1000)
MAX_ERROR = 500  # characters of a failure's reason kept
CHANGES_PAGE = 1000
LISTING_PAGE = 5000


class Item:
    """One file of a group (not done: done files live in LevelDB only)."""

    __slots__ = ("key", "state", "attempts", "member", "until", "version", "props", "error")

    def __init__(self, key, state, attempts=0, member=None, until=0.0, version=0, props=None, error=None):
        self.key, self.state, self.attempts, self.member = key, state, attempts, member
        self.until, self.version, self.props, self.error = until, version, props, error

    def record(self) -> bytes:
        return r.pack_work(self.state, self.attempts, self.member, self.until, self.version,
                           self.props, self.error)

    def delivery(self) -> dict:
        """What a member gets when it claims the file."""
        return {"key": self.key, "version": self.version, "attempt": self.attempts,
                "until": self.until, "object": {"properties": self.props} if self.props else {}}


class Member:
    __slots__ = ("id", "principal", "client", "seen", "waiting")

    def __init__(self, mid: str, principal: str, client: str, now: float):
        self.id, self.principal, self.client, self.seen, self.waiting = mid, principal, client, now, 0


class WorkGroup:
    def __init__(self, store, fields: dict, now: float):
        self.store = store
        self.vid, self.name = fields["view"], fields["name"]
        self.lease = float(fields["lease"])
        self.max_failures = int(fields["max_failures"])
        self.cursor = int(fields["cursor"])
        self.done = int(fields.get("done", 0))  # files finished, ever
        self.created = fields.get("created", now)
        self.items: dict[str, Item] = {}
        self.queue: deque[str] = deque()  # pending keys, oldest first (entries no longer pending are skipped)
        self.members: dict[str, Member] = {}
        self.lock = asyncio.Lock()  # one catch-up at a time
        self.event = asyncio.Event()  # set when files became claimable other than by the view's changes
        for key, rec in store.iter_work(self.vid, self.name):
            if rec[0] == r.DONE:
                continue
            item = Item(key, *rec)
            if item.state == r.IN_FLIGHT:  # members renew after a restart: give them a lease's time
                item.until = max(item.until, now + self.lease)
            self.items[key] = item
        for item in sorted((i for i in self.items.values() if i.state == r.PENDING),
                           key=lambda i: (i.version, i.key)):
            self.queue.append(item.key)

    # --- records ---------------------------------------------------------------------------

    def fields(self) -> dict:
        return {"view": self.vid, "name": self.name, "lease": self.lease,
                "max_failures": self.max_failures, "cursor": self.cursor, "done": self.done,
                "created": self.created}

    def _commit(self, items=(), removed=()) -> None:
        """Write the group's record and the given files' records in one WriteBatch."""
        wb = self.store.batch()
        for item in items:
            wb.put(r.k_work(self.vid, self.name, item.key), item.record())
        for key in removed:
            wb.delete(r.k_work(self.vid, self.name, key))
        wb.put(r.k_group(self.vid, self.name), r.pack_group(self.fields()))
        self.store.write(wb)

    def wake(self) -> None:
        """Wake the members waiting for files (files became pending again)."""
        self.event.set()
        self.event = asyncio.Event()

    # --- members ---------------------------------------------------------------------------

    def member(self, mid: str, principal: str, client: str, now: float) -> Member | None:
        """The member ``mid`` (known from now on), or None when another principal uses that id."""
        m = self.members.get(mid)
        if m is None:
            m = self.members[mid] = Member(mid, principal, client, now)
        elif m.principal != principal:
            return None
        m.seen = now
        return m

    def live_members(self, now: float) -> list[Member]:
        """Members waiting for files now, or heard from within a lease."""
        for mid in [mid for mid, m in self.members.items()
                    if not m.waiting and now - m.seen > 2 * self.lease
                    and not any(i.member == mid for i in self.items.values() if i.state == r.IN_FLIGHT)]:
            del self.members[mid]  # forgotten: gone a while, holding nothing
        return [m for m in self.members.values() if m.waiting or now - m.seen <= self.lease]

    # --- feeding -----------------------------------------------------------------------------

    def feed(self, news: dict) -> None:
        """Apply what :func:`read_news` read: new files become pending; files removed from
        the view leave the group (a later appearance is a new file)."""
        if news["version"] < self.cursor and news["kind"] == "changes":
            return  # read before a newer catch-up was applied
        added, removed = [], []
        for key, op, version, props, known in news["files"]:
            item = self.items.get(key)
            if op == "put":
                if item is None and not known:
                    item = self.items[key] = Item(key, r.PENDING, version=version, props=props)
                    self.queue.append(key)
                    added.append(item)
            elif item is None or item.state != r.IN_FLIGHT:  # a delete: in flight stays to its end
                self.items.pop(key, None)
                removed.append(key)
        self.cursor = max(self.cursor, news["version"])
        self._commit(added, removed)

    # --- leases --------------------------------------------------------------------------------

    def _failed_attempt(self, item: Item, error: str | None) -> None:
        item.member, item.until = None, 0.0
        item.error = (error or "")[:MAX_ERROR] or None
        if item.attempts >= self.max_failures:
            item.state = r.FAILED
        else:
            item.state = r.PENDING
            self.queue.appendleft(item.key)  # first in line again

    def expire(self, now: float) -> None:
        """Leases that ran out: failed attempts."""
        lapsed = [i for i in self.items.values() if i.state == r.IN_FLIGHT and i.until <= now]
        for item in lapsed:
            self._failed_attempt(item, f"lease of member {item.member} ran out")
        if lapsed:
            self._commit(lapsed)
            self.wake()

    def next_expiry(self) -> float:
        return min((i.until for i in self.items.values() if i.state == r.IN_FLIGHT), default=float("inf"))

    def claim(self, mid: str, n: int, now: float) -> list[dict]:
        """Up to ``n`` pending files, now in flight at member ``mid``."""
        self.expire(now)
        taken = []
        while self.queue and len(taken) < n:
            item = self.items.get(self.queue.popleft())
            if item is None or item.state != r.PENDING or item in taken:
                continue
            item.state, item.member, item.until = r.IN_FLIGHT, mid, now + self.lease
            item.attempts += 1
            taken.append(item)
        if taken:
            self._commit(taken)
        return [i.delivery() for i in taken]

    def renew(self, mid: str, now: float) -> list[str]:
        """Renew every lease member ``mid`` holds; the keys it holds."""
        self.expire(now)
        held = [i for i in self.items.values() if i.state == r.IN_FLIGHT and i.member == mid]
        for item in held:
            item.until = now + self.lease
        if held:
            self._commit(held)
        return [i.key for i in held]

    def finish(self, mid: str, key: str, ok: bool, error: str | None) -> str:
        """Member ``mid`` is done with ``key``: the file's state afterwards. An
        acknowledgement counts also after the lease ran out (unless another member already
        failed it for good); a failure counts only from the member holding the file."""
        item = self.items.get(key)
        if item is None:
            rec = self.store.get_work(self.vid, self.name, key)
            return rec[0] if rec else "unknown"
        if ok and item.state != r.FAILED:
            del self.items[key]
            self.done += 1
            item.state, item.member, item.until, item.error = r.DONE, mid, 0.0, None
            self._commit([item])
            return r.DONE
        if not ok and item.state == r.IN_FLIGHT and item.member == mid:
            self._failed_attempt(item, error or "failed")
            self._commit([item])
            self.wake()
        return item.state

    def give_back(self, mid: str, key: str, in_view: bool) -> str:
        """Member ``mid`` gives back ``key`` without having worked on it (its mount could
        not show the file): pending again, first in line, the attempt not counted — or,
        when the file left the view meanwhile (``in_view`` false), it leaves the group. Only
        the member holding the file may; the file's state afterwards (``removed`` when it
        left the group)."""
        item = self.items.get(key)
        if item is None:
            rec = self.store.get_work(self.vid, self.name, key)
            return rec[0] if rec else "unknown"
        if item.state != r.IN_FLIGHT or item.member != mid:
            return item.state
        item.attempts -= 1
        if not in_view:
            # (a deletion while in flight left the file in the group until its end: this is it)
            del self.items[key]
            self._commit(removed=[key])
            return "removed"
        item.state, item.member, item.until = r.PENDING, None, 0.0
        self.queue.appendleft(key)
        self._commit([item])
        self.wake()
        return r.PENDING

    def release(self, mid: str) -> int:
        """Member ``mid`` leaves: its files are pending again, the attempts not counted."""
        held = [i for i in self.items.values() if i.state == r.IN_FLIGHT and i.member == mid]
        for item in held:
            item.state, item.member, item.until = r.PENDING, None, 0.0
            item.attempts -= 1
            self.queue.appendleft(item.key)
        self.members.pop(mid, None)
        if held:
            self._commit(held)
            self.wake()
        return len(held)

    # --- reports -------------------------------------------------------------------------------

    def report(self, now: float) -> dict:
        self.expire(now)
        live = self.live_members(now)
        counts = {r.PENDING: 0, r.IN_FLIGHT: 0, r.FAILED: 0}
        for item in self.items.values():
            counts[item.state] += 1
        held: dict[str, int] = {}
        for item in self.items.values():
            if item.state == r.IN_FLIGHT:
                held[item.member] = held.get(item.member, 0) + 1
        return {"view": self.vid, "name": self.name, "lease": self.lease,
                "max_failures": self.max_failures,
                "members": [{"id": m.id, "client": m.client, "in_flight": held.get(m.id, 0),
                             "seen_ago": round(max(0.0, now - m.seen), 3)} for m in live],
                "in_flight": counts[r.IN_FLIGHT], "done": self.done, "failed": counts[r.FAILED],
                "backlog": counts[r.PENDING], "version": self.cursor,
                "failed_files": [{"key": i.key, "attempts": i.attempts, "error": i.error}
                                 for i in sorted(self.items.values(), key=lambda i: i.key)
                                 if i.state == r.FAILED][:100]}


class Groups:
    """Every group of the handler, loaded from LevelDB when the API starts."""

    def __init__(self, store):
        self.store = store
        now = time.time()
        self.groups: dict[tuple[str, str], WorkGroup] = {}
        for fields in store.load_groups():
            self.groups[(fields["view"], fields["name"])] = WorkGroup(store, fields, now)

    def get(self, vid: str, name: str) -> WorkGroup | None:
        return self.groups.get((vid, name))

    def create(self, vid: str, name: str, lease: float, max_failures: int, cursor: int) -> WorkGroup:
        now = time.time()
        group = WorkGroup(self.store, {"view": vid, "name": name, "lease": lease,
                                       "max_failures": max_failures, "cursor": cursor,
                                       "created": now}, now)
        group._commit()
        self.groups[(vid, name)] = group
        return group

    def of_view(self, vid: str) -> list[WorkGroup]:
        return [g for (v, _n), g in sorted(self.groups.items()) if v == vid]


def read_news(engine, info, group: WorkGroup, relist: bool) -> dict:
    """What the group has not seen of its view, with whether the group already has a record
    of each file: one page of the changes after its cursor (``more`` when there are more),
    or — when ``relist`` or the change log no longer reaches back to the cursor — the whole
    listing (``"kind": "listing"``: call it off the loop). A page of changes is read inline,
    as the change stream reads it. ``{"kind", "version", "more", "files": [(key, op,
    version, props, known)]}``."""
    top = engine.buckets[info.bucket].committed
    floor = engine.change_floor(info)
    files = []
    more = False
    if relist or not floor <= group.cursor <= top:
        after, version = None, None
        while True:
            page = engine.list_view(info, after, LISTING_PAGE)
            version = page["version"] if version is None else version
            for obj in page["objects"]:
                files.append((obj["key"], "put", version, obj.get("properties")))
            after = page["next"]
            if not after:
                break
        kind = "listing"
    else:
        res = engine.changes(info, group.cursor, CHANGES_PAGE)
        for ch in res["changes"]:
            files.append((ch["key"], ch["op"], ch["v"], (ch.get("object") or {}).get("properties")))
        version, more, kind = res["version"], res["more"], "changes"
    news = []
    for key, op, v, props in files:
        if key.endswith("/"):  # a folder marker is a directory, no file to work on
            continue
        known = op == "put" and group.store.get_work(group.vid, group.name, key) is not None
        news.append((key, op, v, props, known))
    return {"kind": kind, "version": version, "more": more, "files": news}


def in_view(engine, info, key: str) -> bool:
    """Whether the view has ``key`` now (the handler's record of the object)."""
    rec = engine.store.get_object(info.bucket, key)
    return rec is not None and not r.is_deleted(rec) and r.bits_has(rec[r.OBJ_SLOTS], info.slot)


def needs_listing(engine, info, group: WorkGroup) -> bool:
    """Whether the change log no longer reaches back to the group's cursor."""
    return not engine.change_floor(info) <= group.cursor <= engine.buckets[info.bucket].committed
