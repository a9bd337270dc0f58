"""Views and their freshness: what the handler says each view holds, fetched lazily.

A view's listing is fetched on first use (paged, each page applied to the tree as it
arrives), then trusted for the view's ``ttl``. The first operation on a view after that
asks the handler for the changes since the last version (a delta) and applies them; a
410 from the handler means "too old": the view is listed again and nodes not seen are
swept. One refresh per view runs at a time; other operations on the view wait for it
(:class:`Refresh`) and share its failure.

Which view an object belongs to is the compiled matcher's answer (``can_match``): the
write side asks it before every upload, rename and retag.
"""
from __future__ import annotations

import errno
import logging
import time
from typing import TYPE_CHECKING

import trio

from ..errors import FsError, handler_failure
from ..handler_api import HandlerError, Resync
from .inodes import Dir, Node, relative_path

if TYPE_CHECKING:
    from .tree import Pending

log = logging.getLogger(__name__)


def _single(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside a nursery's group (else the group itself)."""
    while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
        group = group.exceptions[0]
    return group


class ViewState:
    """One mounted view: its definition, the handler's id and version, its top dir."""

    def __init__(self, view, top_ino: int):
        self.view = view
        self.name = view.name
        self.bucket = view.bucket
        self.root = view.root or ""
        self.flat = view.layout == "flat"
        self.layout = view.layout
        self.set = dict(getattr(view, "set", None) or {})
        self.index = 0  # position in the mount's views (the matcher's answers)
        self.overlay: dict[str, Pending] = {}  # key -> local change not yet seen in a delta
        self.ttl = float(view.ttl)
        self.writable = bool(view.writable)
        self.id: str | None = None
        self.version = 0
        self.listed = False
        self.fresh_at = float("-inf")
        self.refreshing: Refresh | None = None
        self.top: Dir | None = None
        self.lists = 0  # statistics (tests, logs)
        self.deltas = 0


class Refresh:
    """A listing or delta under way for a view; tasks that need the view wait for it and
    share its failure (rather than each asking the handler again: a view of a bucket still
    being scanned would make every waiter wait for its own 503 in turn)."""
    __slots__ = ("done", "error")

    def __init__(self):
        self.done = trio.Event()
        self.error: FsError | None = None


class Views:
    """Registration and freshness of the views of :class:`delvefs.client.fs.core.FileSystem`."""

    async def register(self, client: str, proofs: dict[str, str]) -> None:
        """Register all views with the handler (ids and starting versions)."""
        answer = await self.handler.register(
            client, [{"name": vs.name, "spec": vs.view.filter_spec()} for vs in self.views], proofs)
        by_name = {v["name"]: v for v in answer}
        for vs in self.views:
            vs.id = by_name[vs.name]["id"]

    async def prefetch(self) -> None:
        """List every view in the background right after mounting (errors only logged)."""
        async def one(vs):
            try:
                await self._fresh(vs)
            except FsError as exc:
                log.warning("prefetching view %s: %s", vs.name, exc)
        async with trio.open_nursery() as nursery:
            for vs in self.views:
                nursery.start_soon(one, vs)

    async def _fresh(self, vs: ViewState) -> None:
        """Make ``vs`` recent: list it (first use) or apply the handler's delta."""
        while True:
            if vs.refreshing is not None:
                r = vs.refreshing
                await r.done.wait()
                if r.error is not None:
                    raise FsError(r.error.errno, str(r.error), logged=True)
                continue
            if vs.listed and trio.current_time() - vs.fresh_at < vs.ttl:
                return
            r = vs.refreshing = Refresh()
            try:
                if not vs.listed:
                    await self._list(vs, resync=False)
                else:
                    await self._delta(vs)
            except HandlerError as exc:
                r.error = handler_failure(exc, f"view {vs.name}")
                raise r.error from exc
            finally:
                vs.refreshing = None
                r.done.set()
            return

    async def _fresh_for(self, node: Node) -> None:
        vs = node.view if node.is_dir else node.parent.view
        if vs is not None:
            await self._fresh(vs)

    async def _list(self, vs: ViewState, *, resync: bool) -> None:
        started = trio.current_time()
        vs.lists += 1
        first_version = None
        seen: set[str] | None = set() if resync else None
        # pages are fetched one ahead: the handler produces page k+1 while page k is applied
        send, recv = trio.open_memory_channel(1)

        async def fetch_pages():
            async with send:
                after = None
                while True:
                    page = await self.handler.list_page(vs.id, after, self.page_size)
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
                        put = self._put
                        for obj in page["objects"]:  # one page: applied without an await
                            put(vs, obj, notify=resync)
                        if seen is not None:
                            seen.update(obj["key"] for obj in page["objects"])
        except BaseExceptionGroup as group:
            raise _single(group) from None
        if seen is not None:
            now = trio.current_time()
            seen.update(k for k, p in vs.overlay.items() if p.kind != "delete" and p.deadline > now)
            self._sweep(vs, seen)
        vs.version = first_version
        vs.listed = True
        await self._delta(vs, started=started, allow_resync=False)

    async def _delta(self, vs: ViewState, *, started: float | None = None,
                     allow_resync: bool = True) -> None:
        started = trio.current_time() if started is None else started
        vs.deltas += 1
        try:
            while True:
                r = await self.handler.changes(vs.id, vs.version, self.page_size)
                changes = r["changes"]
                for ch in changes:
                    if ch["op"] == "put" and ch.get("object"):
                        self._put(vs, ch["object"], notify=True)
                    elif ch["op"] == "delete":
                        self._delete(vs, ch["key"])
                more = bool(r.get("more")) and bool(changes)
                vs.version = changes[-1]["v"] if more else r["version"]
                if not more:
                    break
        except Resync:
            if not allow_resync:
                raise HandlerError(f"view {vs.name}: handler asks to resync right after a listing")
            log.info("view %s: version %s too old, listing again", vs.name, vs.version)
            await self._list(vs, resync=True)
            return
        vs.fresh_at = started

    async def sync(self, vs: ViewState, value: bytes) -> None:
        """``setxattr(VIEWDIR, "user.delvefs.sync", b"<version>")``: returns once this
        mount's listing of the view includes the handler's changes up to ``version``
        (a delta is fetched now, ignoring ttl, unless the known version is that recent)."""
        try:
            version = int(value.decode().strip())
        except (UnicodeDecodeError, ValueError):
            raise FsError(errno.EINVAL, "user.delvefs.sync wants a version number") from None
        for _ in range(2):
            if vs.listed and vs.version >= version:
                return
            if vs.refreshing is not None:
                await vs.refreshing.done.wait()
                continue
            vs.fresh_at = float("-inf")
            await self._fresh(vs)

    # ------------------------------------------------------------ which view

    def _matcher(self):
        if self._matcher_obj is None:
            from rulesets.matcher import compile_views
            self._matcher_obj = compile_views([vs.view for vs in self.views])
        return self._matcher_obj

    def can_match(self, vs: ViewState, key: str, size: int, tags: dict) -> bool:
        """Whether an object ``key`` of ``size`` with ``tags`` would be in view ``vs`` (and
        shown as a file there): the scratch rule asks this before every upload."""
        rel = relative_path(vs, key)
        if rel is None or rel.endswith("/"):
            return False
        from rulesets.model import ObjectInfo
        obj = ObjectInfo(vs.bucket, key, int(size), time.time(), None, dict(tags), {})
        return vs.index in self._matcher().match(obj)

    def _needs_tags(self, bucket: str) -> bool:
        return any(vs.view.reads_tags for vs in self.views if vs.bucket == bucket)
