from __future__ import annotations

import errno
import os

import pytest

from delvefs.client.mount.cache.datacache import DataCache
from delvefs.client.mount.errors import FsError
from delvefs.client.mount.fs.core import FileSystem
from delvefs.client.mount.settings import MountSettings
from rulesets.model import View

from .fakes import FakeHandler, FakeStore, RecordingNotifier


class World:
    """A core wired to fakes; ``add`` puts an object into S3 and into a view's listing."""

    def __init__(self, tmp_path, views, cache_limit=None, handler=None, store=None, settings=None,
                 reregister=None):
        self.tmp_path = tmp_path
        self.cache_limit = cache_limit
        self.settings = settings or MountSettings.defaults(uid=1000, gid=1000)
        self.handler = handler or FakeHandler()
        self.store = store or FakeStore()
        self.notifier = RecordingNotifier()
        self.cache = DataCache(tmp_path / "cache", cache_limit)
        self.views = {v.name: v for v in views}
        for v in views:
            self.handler._state(v.name)
        self.fs = FileSystem(views, self.handler, self.store, self.cache, self.settings,
                             notifier=self.notifier, reregister=reregister)

    def add(self, view: str, key: str, data: bytes = b"", **kw) -> dict:
        obj = self.store.put(self.views[view].bucket, key, data, **kw)
        self.handler.put(view, key, obj["size"], obj["etag"], obj["mtime"])
        return obj

    def remove(self, view: str, key: str):
        self.store.objects.pop((self.views[view].bucket, key), None)
        self.handler.delete(view, key)

    async def start(self):
        await self.fs.register("test", {})
        return self

    async def path(self, path: str):
        """Resolve a path like the kernel: a lookup per component (adds lookups)."""
        node = self.fs.table.root
        for part in [p for p in path.split("/") if p]:
            node = await self.fs.lookup(node.ino, part)
            if node is None:
                return None
        return node

    async def names(self, path: str = "") -> list[str]:
        node = await self.path(path) if path else self.fs.table.root
        fh = await self.fs.opendir(node.ino)
        out = []
        await self.fs.readdir(fh, 0, lambda name, n, off: out.append(name) or True)
        self.fs.releasedir(fh)
        return out

    def restart(self) -> "World":
        """A new mount of the same cache directory, store and handler (after a crash)."""
        self.fs.close()
        return World(self.tmp_path, list(self.views.values()), self.cache_limit,
                     handler=self.handler, store=self.store, settings=self.settings)

    def obj(self, view: str, key: str) -> dict | None:
        """What the fake S3 holds, or None."""
        return self.store.objects.get((self.views[view].bucket, key))

    def sync_handler(self, view: str, key: str):
        """The handler learns about an object the mount wrote (as its event would tell)."""
        o = self.obj(view, key)
        if o is None:
            self.handler.delete(view, key)
        else:
            self.handler.put(view, key, len(o["data"]), o["etag"], o["mtime"])

    async def open_write(self, path: str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
        """(fh, node) of ``path`` opened for writing like open(2) would: create when
        missing (O_CREAT), else open."""
        parent, _, name = path.rpartition("/")
        pnode = await self.path(parent)
        node = await self.fs.lookup(pnode.ino, name)
        if node is None:
            return await self.fs.create(pnode.ino, name, flags)
        fh, _ = await self.fs.open(node.ino, flags)
        return fh, node

    async def close(self, fh):
        """close(2): flush (its error is close's error), then release."""
        try:
            await self.fs.flush(fh)
        finally:
            await self.fs.release(fh)

    async def write(self, path: str, data: bytes, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                    offset: int = 0):
        fh, node = await self.open_write(path, flags)
        try:
            if data:
                await self.fs.write(fh, offset, data)
        except BaseException:
            await self.fs.release(fh)
            raise
        await self.close(fh)
        return node

    async def read(self, path: str) -> bytes:
        node = await self.path(path)
        try:
            fh, _ = await self.fs.open(node.ino, 0)
        except FsError as exc:  # the kernel looks the name up again once (open(2) on ESTALE)
            if exc.errno != errno.ESTALE:
                raise
            fh, _ = await self.fs.open((await self.path(path)).ino, 0)
        try:
            return await self.fs.read(fh, 0, 1 << 30)
        finally:
            await self.fs.release(fh)


def view(name, bucket="b", object="data/*", ttl=2.0, layout="tree", root=None, writable=False,
         properties=None, set=None):
    from rulesets.model import default_root, default_set
    props = {k: tuple(v) for k, v in (properties or {}).items()}
    return View(name=name, bucket=bucket, object=object, ttl=ttl, layout=layout,
                root=default_root(object) if root is None else root, writable=writable,
                properties=props, set=default_set(props) if set is None else set)


@pytest.fixture
def make_world(tmp_path):
    def make(*views, cache_limit=None, reregister=None, **settings):
        """A world of ``views``; ``settings``: the mount's settings that differ from the
        defaults (``eager=True``, ``stale_after=0.5``, ...)."""
        return World(tmp_path, list(views) or [view("v")], cache_limit,
                     settings=MountSettings.defaults(uid=1000, gid=1000, **settings),
                     reregister=reregister)
    return make
