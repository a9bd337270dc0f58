"""Views and their freshness: what the handler says each view holds, fetched lazily.

A view's listing is fetched on first use (paged, each page applied to the tree as it
arrives), then trusted for the view's ``ttl``. The first operation on a view after that
asks the handler for the changes since the last version (a delta) and applies them; a
410 from the handler means "too old": the view is listed again and nodes not seen are
swept.

One refresh per view runs at a time, in a task of its own (:meth:`Listings.start_refresh`:
an operation that stops waiting for it leaves it running); operations on the view wait
for it (:class:`Refresh`) and share its outcome:

- A view never listed waits for its listing and fails with the refresh's error
  (``handler_failure``). While the handler's first scan of the bucket runs, the listing
  waits for the scan, up to ``scan_wait`` (a setting, ``DELVEFS_SCAN_WAIT``: an hour), logging its
  progress.
- A view with a listing waits at most ``stale_after`` seconds (a setting,
  ``DELVEFS_STALE_AFTER``: 2 s) from the refresh's start, then is served the last listing: it is *stale* (logged
  once per outage, shown by ``user.delvefs.stale``). The refresh goes on; after a failed
  one, the next is started by the first operation after a backoff (1 s, doubling up to
  10 s), and operations meanwhile do not wait. The first refresh that succeeds makes the
  view fresh again: a delta covers the gap, a 410 relists.
- A 404 (the handler does not know the view: it lost its state) registers the views again
  (``reregister``: the mount's, with its proofs) and lists the view again.

The views themselves change with ``reload`` (``delvefs reload``, SIGHUP): the new set is
registered first, then swapped in without an await (``delvefs.client.mount.fs.catalog``).
"""
from __future__ import annotations

import errno
import logging
import time

import trio

from ..errors import FsError, handler_failure
from ...handler.api import HandlerError, HandlerUnavailable, Resync
from .catalog import RETRY_FIRST, RETRY_MAX, Refresh, ViewCatalog, ViewState
from .inodes import Node
from .tree import Tree

log = logging.getLogger(__name__)


def _single(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside a nursery's group (else the group itself)."""
    while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
        group = group.exceptions[0]
    return group


class Listings:
    """Registration and freshness of the mount's views."""

    def __init__(self, catalog: ViewCatalog, tree: Tree, handler, written, settings, *,
                 reregister=None):
        self.catalog = catalog
        self.tree = tree
        self.handler = handler
        self.written = written
        self.stale_after = settings.stale_after
        self.scan_wait = settings.scan_wait
        self.page_size = settings.page_size
        self.reregister = reregister  # async (): register the views again (the mount's, with proofs)
        self.registration: tuple[str, dict] | None = None  # (client, proofs) of the last one
        self.registrations = 0
        self._reload_lock = trio.Lock()

    async def register(self, client: str, proofs: dict) -> None:
        """Register all views with the handler (ids and starting versions)."""
        views = list(self.catalog.views)  # (a reload may change the list meanwhile)
        answer = await self.handler.register(
            client, [{"name": vs.name, "spec": vs.view.filter_spec()} for vs in views], proofs)
        self.registration = (client, proofs)
        self.registrations += 1
        by_name = {v["name"]: v for v in answer}
        for vs in views:
            if vs.name in by_name:
                vs.listing.id = by_name[vs.name]["id"]

    async def reload(self, views, proofs: dict) -> dict:
        """Replace the mount's views by ``views`` (its views file, read again and valid):
        the whole set is registered with the handler first (with ``proofs`` covering it), so
        a refusal changes nothing; then, without an await, new views get their directory,
        dropped ones lose theirs, and a changed one (same name, other rules or options) gets
        a new, empty directory listed anew. Files of a dropped or replaced directory that
        are open keep working until closed; dirty ones are still uploaded (a changed view's
        show in its new directory). Last, the handler is told to forget registrations no
        view of this mount uses any more. Returns ``{"added", "removed", "changed",
        "views"}`` (names)."""
        async with self._reload_lock:
            old = {vs.name: vs for vs in self.catalog.views}
            wanted = {v.name: v for v in views}
            added = [v.name for v in views if v.name not in old]
            removed = [name for name in old if name not in wanted]
            changed = [v.name for v in views if v.name in old and old[v.name].view != v]
            summary = {"added": added, "removed": removed, "changed": changed,
                       "views": [v.name for v in views]}
            if not (added or removed or changed):
                return summary
            client = self.registration[0] if self.registration else "delvefs"
            answer = await self.handler.register(
                client, [{"name": v.name, "spec": v.filter_spec()} for v in views], proofs)
            ids = {a["name"]: a["id"] for a in answer}
            missing = [v.name for v in views if v.name not in ids]
            if missing:
                raise HandlerError(f"the event handler registered no view named {missing[0]!r}")
            self.registration = (client, proofs)
            self.registrations += 1
            # from here to the end of the swap: no await (operations see old or new views)
            retired = [old[name] for name in removed + changed]
            for vs in retired:
                vs.retired = True
                self.tree.retire_view(vs)
            states = []
            for i, v in enumerate(views):
                vs = old.get(v.name)
                if vs is None or vs.retired:
                    vs = ViewState(v, i)
                    self.tree.add_view(vs)
                vs.listing.id = ids[v.name]
                states.append(vs)
            # a dropped view's dirty files are still uploaded: the catalog keeps it by name
            # until its name is used again
            self.catalog.replace(states)
            for entry in self.written.entries():  # dirty files of a changed view: in its new directory
                vs = self.catalog.get((entry.meta or {}).get("view"))
                if vs is not None and vs.name in changed and entry.bucket == vs.bucket:
                    self.tree.show_dirty(vs, entry, notify=False)
            log.info("views reloaded: added %s; removed %s; changed %s",
                     *(", ".join(names) or "none" for names in (added, removed, changed)))
            # registrations no view of this mount uses any more
            unregister = getattr(self.handler, "unregister", None)
            for view_id in {vs.listing.id for vs in retired} - set(ids.values()) - {None}:
                if unregister is None:
                    break
                try:
                    await unregister(view_id)
                except HandlerError as exc:  # the handler forgets unused views itself in time
                    log.warning("unregistering view %s from the event handler: %s", view_id, exc)
            return summary


    async def _register_again(self) -> None:
        """The handler lost the views: register them again, through the mount's hook
        (fresh proofs) or else as the last time."""
        if self.reregister is not None:
            await self.reregister()
        else:
            await self.register(*self.registration)

    async def prefetch(self) -> None:
        """List every view in the background right after mounting (failures are logged
        by the refresh, once per outage)."""
        async def one(vs):
            try:
                await self.fresh(vs)
            except FsError:
                pass
        async with trio.open_nursery() as nursery:
            for vs in self.catalog.views:
                nursery.start_soon(one, vs)

    def due(self, vs: ViewState) -> bool:
        """Whether ``fresh`` has anything to do for ``vs`` (a view dropped by a reload
        never has: its open files are served as they are)."""
        return not (vs.listing.listed and trio.current_time() - vs.listing.fresh_at < vs.ttl or vs.retired)

    async def fresh(self, vs: ViewState) -> None:
        """Make ``vs`` recent enough for an operation: list it (first use; its error is
        the operation's) or refresh it after its ttl (waiting at most ``stale_after``, then
        going on with the last listing)."""
        if not self.due(vs):
            return
        now = trio.current_time()
        r = vs.listing.refreshing
        if r is None:
            if vs.listing.listed and now < vs.listing.retry_at:
                return  # stale, and the next attempt is not due yet
            r = self.start_refresh(vs)
        if r.first:
            await r.done.wait()
            if r.error is not None and not vs.listing.listed:
                raise FsError(r.error.errno, str(r.error), logged=True)
            return
        with trio.move_on_at(r.started + self.stale_after):
            await r.done.wait()
        if not r.done.is_set() and vs.listing.stale is None:  # (else keep the reason of the outage)
            self._mark_stale(vs, f"a refresh has taken more than {self.stale_after:g} s")

    async def fresh_for(self, node: Node) -> None:
        vs = node.view if node.is_dir else node.parent.view
        if vs is not None:
            await self.fresh(vs)

    def due_for(self, node: Node) -> bool:
        """Whether ``fresh_for(node)`` has anything to do: checked first by the most
        frequent requests (lookup, getattr), which then skip its coroutines."""
        vs = node.view if node.is_dir else node.parent.view
        return vs is not None and self.due(vs)

    def start_refresh(self, vs: ViewState) -> Refresh:
        r = vs.listing.refreshing = Refresh(trio.current_time(), first=not vs.listing.listed)
        # a system task: it outlives the operation that started it, and needs no nursery
        # of the mount's
        trio.lowlevel.spawn_system_task(self._refresh, vs, r, name=f"refresh of view {vs.name}")
        return r

    async def _refresh(self, vs: ViewState, r: Refresh) -> None:
        """The task of one refresh: its outcome in ``r``, the view's staleness updated."""
        succeeded = False
        try:
            await self._refresh_once(vs)
            succeeded = True
        except HandlerError as exc:
            r.error = handler_failure(exc, f"view {vs.name}")
            self._failed(vs, self._reason(vs, exc))
        except Exception as exc:  # noqa: BLE001 — a system task must not raise: logged, EIO
            log.exception("refreshing view %s", vs.name)
            r.error = FsError(errno.EIO, f"refreshing view {vs.name}: {exc}", logged=True)
            self._failed(vs, f"{type(exc).__name__}: {exc}")
        finally:
            if not succeeded and r.error is None:  # cancelled (the mount ends)
                r.error = FsError(errno.EIO, f"refreshing view {vs.name}: cancelled", logged=True)
            vs.listing.refreshing = None
            r.done.set()
        if succeeded:
            self._answered(vs)

    async def _refresh_once(self, vs: ViewState) -> None:
        registrations = self.registrations
        try:
            if not vs.listing.listed or vs.listing.relist:
                await self._list(vs, resync=vs.listing.listed)
            else:
                await self._delta(vs)
        except HandlerError as exc:
            if exc.status != 404:
                raise
            # the handler does not know the view: it lost its state. Its versions start
            # anew, so the view is listed again (also if that fails now: at the next refresh)
            vs.listing.relist = vs.listing.listed
            if self.registrations == registrations:  # (else someone registered meanwhile)
                log.warning("view %s: the event handler does not know it (%s): registering the "
                            "views again", vs.name, exc)
                await self._register_again()
            await self._list(vs, resync=vs.listing.listed)

    def _reason(self, vs: ViewState, exc: HandlerError) -> str:
        if exc.code == "scanning":
            listed = exc.body.get("listed")
            return (f"the event handler is scanning bucket {vs.bucket}"
                    + (f" ({listed} objects listed so far)" if listed is not None else ""))
        return str(exc)

    def _mark_stale(self, vs: ViewState, reason: str) -> None:
        """The handler gave no refresh of ``vs``: logged at the start of an outage."""
        if vs.listing.stale is None:
            vs.listing.stale_since = time.time()
            if vs.listing.listed:
                log.warning("view %s is stale: %s; serving its last listing until the event "
                            "handler answers", vs.name, reason)
            else:
                log.warning("view %s: no listing: %s", vs.name, reason)
        vs.listing.stale = reason

    def _failed(self, vs: ViewState, reason: str) -> None:
        self._mark_stale(vs, reason)
        vs.listing.retry_at = trio.current_time() + vs.listing.retry_delay
        vs.listing.retry_delay = min(vs.listing.retry_delay * 2, RETRY_MAX)

    def _answered(self, vs: ViewState) -> None:
        vs.listing.retry_at = float("-inf")
        vs.listing.retry_delay = RETRY_FIRST
        if vs.listing.stale is not None:
            log.info("view %s is fresh again (stale for %.0f s)", vs.name,
                     time.time() - vs.listing.stale_since)
            vs.listing.stale = None

    async def _page(self, vs: ViewState, after: str | None, scan_until: float) -> dict:
        """A page of ``vs``'s listing. While the handler's first scan of the bucket runs, a
        view never listed waits for it (until ``scan_until``), logging its progress; a view
        listed before (the handler lost its state) stays stale until the scan is done."""
        while True:
            try:
                # the first page after what the handler's broker held: a mount started after
                # a PUT returned lists its object (docs/SEMANTICS.md, read-your-writes)
                return await self.handler.list_page(vs.listing.id, after, self.page_size, hold=not vs.listing.listed,
                                                    fresh=after is None)
            except HandlerUnavailable as exc:
                now = trio.current_time()
                if exc.code != "scanning" or vs.listing.listed or now >= scan_until:
                    raise
                log.info("view %s: waiting for the event handler's first scan of bucket %s "
                         "(%s objects listed so far); the view's first listing waits up to "
                         "%.0f s more (DELVEFS_SCAN_WAIT)", vs.name, vs.bucket,
                         exc.body.get("listed", "?"), scan_until - now)

    async def _list(self, vs: ViewState, *, resync: bool) -> None:
        started = trio.current_time()
        scan_until = started + self.scan_wait
        vs.listing.lists += 1
        first_version = None
        seen: set[str] | None = set() if resync else None
        # pages are fetched one ahead: the handler produces page k+1 while page k is applied
        send, recv = trio.open_memory_channel(1)

        async def fetch_pages():
            async with send:
                after = None
                while True:
                    page = await self._page(vs, after, scan_until)
                    await send.send(page)
                    after = page.get("next")
                    if not after or not page["objects"]:
                        return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fetch_pages)
                async with recv:
                    async for page in recv:
                        if first_version is None:
                            first_version = page["version"]
                        put = self.tree.put
                        for obj in page["objects"]:  # one page: applied without an await
                            put(vs, obj, notify=resync)
                        if seen is not None:
                            seen.update(obj["key"] for obj in page["objects"])
        except BaseExceptionGroup as group:
            raise _single(group) from None
        if seen is not None:
            seen.update(self.tree.pending_keys(vs))
            self.tree.sweep(vs, seen)
        vs.listing.version = first_version
        vs.listing.listed = True
        vs.listing.relist = False
        await self._delta(vs, started=started, allow_resync=False)

    async def _delta(self, vs: ViewState, *, started: float | None = None,
                     allow_resync: bool = True) -> None:
        started = trio.current_time() if started is None else started
        vs.listing.deltas += 1
        try:
            while True:
                r = await self.handler.changes(vs.listing.id, vs.listing.version, self.page_size)
                changes = r["changes"]
                for ch in changes:
                    if ch["op"] == "put" and ch.get("object"):
                        self.tree.put(vs, ch["object"], notify=True)
                    elif ch["op"] == "delete":
                        self.tree.delete(vs, ch["key"])
                more = bool(r.get("more")) and bool(changes)
                vs.listing.version = changes[-1]["v"] if more else r["version"]
                if not more:
                    break
        except Resync:
            if not allow_resync:
                raise HandlerError(f"view {vs.name}: handler asks to resync right after a listing")
            log.info("view %s: version %s too old, listing again", vs.name, vs.listing.version)
            await self._list(vs, resync=True)
            return
        vs.listing.fresh_at = started

    async def refresh_now(self, vs: ViewState) -> FsError | None:
        """A refresh of ``vs`` now, whatever its ttl (or the one under way); its error."""
        r = vs.listing.refreshing or self.start_refresh(vs)
        await r.done.wait()
        return r.error

    async def sync(self, vs: ViewState, value: bytes) -> None:
        """``setxattr(VIEWDIR, "user.delvefs.sync", b"<version>")``: returns once this
        mount's listing of the view includes the handler's changes up to ``version``
        (a delta is fetched now, ignoring ttl and a stale view's backoff, unless the known
        version is that recent); fails with the refresh's error when the handler gives none.
        ``b"now"``: whatever version the mount knows, a refresh now — where the view's
        handler no longer knows it (its bucket moved to another shard), that registers the
        views again (``delvefs watch`` asks so)."""
        text = value.decode(errors="replace").strip()
        if text == "now":
            error = await self.refresh_now(vs)
            if error is not None:
                raise FsError(error.errno, str(error), logged=True)
            return
        try:
            version = int(text)
        except ValueError:
            raise FsError(errno.EINVAL, "user.delvefs.sync wants a version number (or \"now\")") from None
        for _ in range(2):
            if vs.listing.listed and vs.listing.version >= version:
                return
            r = vs.listing.refreshing or self.start_refresh(vs)
            await r.done.wait()
            if r.error is not None:
                raise FsError(r.error.errno, str(r.error), logged=True)
