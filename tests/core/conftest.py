from __future__ import annotations

import pytest

from delvefs.cache import DataCache
from delvefs.fs.core import FileSystem
from rulesets.model import View

from .fakes import FakeHandler, FakeStore, RecordingNotifier


class World:
    """A core wired to fakes; ``add`` puts an object into S3 and into a view's listing."""

    def __init__(self, tmp_path, views, cache_limit=None):
        self.handler = FakeHandler()
        self.store = FakeStore()
        self.notifier = RecordingNotifier()
        self.cache = DataCache(tmp_path / "cache", cache_limit)
        self.views = {v.name: v for v in views}
        for v in views:
            self.handler._state(v.name)
        self.fs = FileSystem(views, self.handler, self.store, self.cache, notifier=self.notifier,
                             uid=1000, gid=1000)

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

    async def read(self, path: str) -> bytes:
        node = await self.path(path)
        fh, _ = await self.fs.open(node.ino, 0)
        try:
            return await self.fs.read(fh, 0, 1 << 30)
        finally:
            await self.fs.release(fh)


def view(name, bucket="b", object="data/*", ttl=2.0, layout="tree", root=None, writable=False):
    from rulesets.model import default_root
    return View(name=name, bucket=bucket, object=object, ttl=ttl, layout=layout,
                root=default_root(object) if root is None else root, writable=writable)


@pytest.fixture
def make_world(tmp_path):
    def make(*views, cache_limit=None):
        return World(tmp_path, list(views) or [view("v")], cache_limit)
    return make
