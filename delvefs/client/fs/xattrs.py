"""Extended attributes: an object's tags, metadata and facts; a view's info and sync.

``user.<tag>`` is the object's tag (set/removed with PutObjectTagging, merged with the
current tag set; the file moves into and out of this mount's views at once),
``user.meta.<name>`` its user metadata (read-only), ``user.delvefs.etag`` / ``bucket`` /
``key`` facts. A view's top directory answers ``user.delvefs.view`` (``delvefs watch``)
and ``user.delvefs.stale`` (whether the handler gave the last refresh: "0", or "1 since
<time>: <reason>"), and accepts ``user.delvefs.sync`` (wait for a handler version). A file not yet in S3 as
written answers ``user.delvefs.upload``: ``pending``, ``uploading``, ``failed: <reason>``
or ``conflict: <reason>`` (absent once uploaded). Other namespaces (security.*, system.*,
trusted.*) are not supported.
"""
from __future__ import annotations

import errno
import json

import trio

from ..errors import FsError, StoreError, read_only, store_failure
from .inodes import File
from .views import ViewState, stale_text


class Xattrs:
    """The extended attribute operations of :class:`delvefs.client.fs.core.FileSystem`."""

    FACTS = ("user.delvefs.etag", "user.delvefs.bucket", "user.delvefs.key")
    VIEW_ATTRIBUTES = ["user.delvefs.view", "user.delvefs.stale"]

    def _upload_text(self, node: File) -> str | None:
        """``user.delvefs.upload`` of a file: None when S3 has it as shown (clean)."""
        entry = self.cache.get(node.parent.view.bucket, node.key)
        if entry is None or not entry.dirty or entry.meta is None:
            return None
        state, reason = self.upload_state(entry)
        return f"{state}: {reason}" if reason else state

    async def _properties(self, node: File) -> tuple[dict, dict]:
        vs = node.parent.view
        entry = self.cache.get(vs.bucket, node.key)
        if entry is not None and entry.dirty and not entry.meta.get("existing") and not node.etag:
            return self._final_tags(entry, vs, None), {}  # not uploaded yet: what it will get
        cached = self._props.get(node.ino)
        now = trio.current_time()
        if cached is not None and now - cached[0] < vs.ttl and cached[3] == node.etag:
            return cached[1], cached[2]
        result = {}

        async def head():
            result["head"] = await self.store.head(vs.bucket, node.key)

        async def tags():
            result["tags"] = await self.store.tags(vs.bucket, node.key)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(head)
                nursery.start_soon(tags)
        except* StoreError as group:
            raise store_failure(group.exceptions[0], "reading properties of", vs.bucket,
                                node.key) from None
        metadata = {k.lower(): v for k, v in result["head"]["metadata"].items()}
        tags = result["tags"] or {}
        if entry is not None and entry.dirty:
            tags = self._final_tags(entry, vs, tags)
        self._props[node.ino] = (now, tags, metadata, node.etag)
        return tags, metadata

    def view_info(self, vs: ViewState) -> dict:
        """What ``user.delvefs.view`` on a view's directory answers (delvefs watch): its
        ``layout`` is "tree", "flat" or "by" (then ``layout_by``: the property names, one
        directory level each, in order)."""
        info = {"id": vs.id, "name": vs.name,
                "handler": getattr(self.handler, "base_url", None), "bucket": vs.bucket,
                "root": vs.root, "layout": "by" if vs.by else "flat" if vs.flat else "tree",
                "version": vs.version}
        if vs.by:
            info["layout_by"] = list(vs.by)
        return info

    async def getxattr(self, ino: int, name: str) -> bytes:
        node = self._node(ino)
        if not name.startswith("user."):
            # security.*, system.posix_acl_*, trusted.*: not supported here. ENOTSUP (not
            # ENODATA) lets tools such as ls -l stop asking for every further file.
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir:
            vs = node.view
            if vs is not None and node is vs.top and name == "user.delvefs.view":
                if not vs.listed:  # a version means something once the view is listed
                    await self._fresh(vs)
                return json.dumps(self.view_info(vs)).encode()
            if vs is not None and node is vs.top and name == "user.delvefs.stale":
                return stale_text(vs).encode()  # as of the last refresh: asks nothing
            raise FsError(errno.ENODATA)
        vs = node.parent.view
        if name == "user.delvefs.upload":
            state = self._upload_text(node)
            if state is None:
                raise FsError(errno.ENODATA)
            return state.encode()
        if name == "user.delvefs.etag":
            return node.etag.encode()
        if name == "user.delvefs.bucket":
            return vs.bucket.encode()
        if name == "user.delvefs.key":
            return node.key.encode("utf-8", "surrogateescape")
        tags, metadata = await self._properties(node)
        if name.startswith("user.meta."):
            value = metadata.get(name[len("user.meta."):].lower())
        else:
            value = tags.get(name[len("user."):])
        if value is None:
            raise FsError(errno.ENODATA)
        return value.encode("utf-8", "surrogateescape")

    async def listxattr(self, ino: int) -> list[str]:
        node = self._node(ino)
        if node.is_dir:
            vs = node.view
            return list(self.VIEW_ATTRIBUTES) if vs is not None and node is vs.top else []
        tags, metadata = await self._properties(node)
        upload = ["user.delvefs.upload"] if self._upload_text(node) is not None else []
        return ([*self.FACTS] + upload + [f"user.{t}" for t in sorted(tags)]
                + [f"user.meta.{m}" for m in sorted(metadata)])

    async def setxattr(self, ino: int, name: str, value: bytes) -> None:
        node = self._node(ino)
        if not name.startswith("user."):
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir:
            vs = node.view
            if vs is not None and node is vs.top and name == "user.delvefs.sync":
                await self.sync(vs, value)
                return
            raise FsError(errno.EPERM, "directories have no tags")
        if name.startswith(("user.delvefs.", "user.meta.")):
            raise FsError(errno.EPERM, f"{name} is read-only")
        await self._retag(node, {name[len("user."):]: value.decode("utf-8", "surrogateescape")}, ())

    async def removexattr(self, ino: int, name: str) -> None:
        node = self._node(ino)
        if not name.startswith("user."):
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir or name.startswith(("user.delvefs.", "user.meta.")):
            raise FsError(errno.EPERM, f"{name} is read-only")
        await self._retag(node, {}, (name[len("user."):],))

    async def _object_tags(self, bucket: str, key: str, what: str) -> dict:
        """The tags of an object that must exist (ENOENT when it is gone)."""
        try:
            tags = await self.store.tags(bucket, key)
        except StoreError as exc:
            raise store_failure(exc, f"{what} (reading tags of)", bucket, key) from exc
        if tags is None:
            raise FsError(errno.ENOENT, f"{bucket}/{key}: no such object")
        return tags

    async def _retag(self, node: File, add: dict, remove: tuple) -> None:
        """PutObjectTagging (merged with the current tag set); the file moves into and out
        of this mount's views at once (other mounts: through the handler)."""
        vs = node.parent.view
        if not vs.writable:
            raise read_only(vs.name)
        if node.gone:
            raise FsError(errno.ENOENT)
        bucket, key = vs.bucket, node.key
        entry = self.cache.get(bucket, key)
        if entry is not None and entry.dirty:  # applied with the upload
            tags = dict(entry.meta.get("tags") or {})
            untag = set(entry.meta.get("untag") or ())
            current, _ = await self._properties(node)
            for t in remove:
                if t not in current:
                    raise FsError(errno.ENODATA)
                tags.pop(t, None)
                untag.add(t)
            tags.update(add)
            untag -= set(add)
            try:
                self.dirty.update_record(entry, tags=tags, untag=sorted(untag))
            except StoreError as exc:
                raise store_failure(exc, "tagging", bucket, key) from exc
            self._props.pop(node.ino, None)
            return
        current = await self._object_tags(bucket, key, "tagging")
        new = {**current, **add}
        for t in remove:
            if t not in new:
                raise FsError(errno.ENODATA)
            del new[t]
        try:
            await self.store.put_tags(bucket, key, new)
        except StoreError as exc:
            raise store_failure(exc, "tagging", bucket, key) from exc
        self._props.clear()
        if node.gone or node.key != key:
            return
        obj = {"key": key, "size": node.size, "mtime": node.mtime_ns / 1e9, "etag": node.etag}
        self._local_put(bucket, key, obj, new)
