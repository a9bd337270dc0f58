"""An object's tags and user metadata, as the file system shows and changes them.

``Properties.of`` answers a file's (tags, metadata): a dirty file not yet in S3 has what
its upload will give it (``final_tags``); an object's are read from S3 (HEAD and
GetObjectTagging at once) and kept for the view's ``ttl`` while its ETag stays. ``retag``
is PutObjectTagging merged with the current tag set (a dirty file's tags are kept in its
record and applied with its upload); the file moves into and out of this mount's views at
once. The tags of the versions this mount wrote or retagged itself are remembered
(``wrote``): an overwrite of such a version within the view's ``ttl`` keeps them without
asking S3 (``known_tags``: the close's one request is its PutObject).
"""
from __future__ import annotations

import collections
import errno

import trio

from ..errors import FsError, StoreError, read_only, store_failure
from .inodes import File


WRITTEN_KEPT = 4096  # the newest keys this mount wrote whose tags it remembers


def final_tags(entry, vs, remote: dict | None) -> dict:
    """The tags a dirty ``entry`` is uploaded with: the object's (``remote``), the view's
    ``set`` tags, then the ones set and removed while it was dirty."""
    tags = dict(remote or {})
    if vs is not None:
        tags.update(vs.set)
    tags.update(entry.meta.get("tags") or {})
    for t in entry.meta.get("untag") or ():
        tags.pop(t, None)
    return tags


class Properties:
    """Tags and metadata of files (cached per inode)."""

    def __init__(self, store, cache, written, tree):
        self.store = store
        self.cache = cache
        self.written = written
        self.tree = tree
        self._cached: dict[int, tuple] = {}  # ino -> (time, tags, metadata, etag)
        # (bucket, key) -> (ETag, tags, when: trio clock) of this mount's last write of the key
        self._written: collections.OrderedDict = collections.OrderedDict()

    def wrote(self, bucket: str, key: str, etag: str, tags: dict) -> None:
        """This mount made version ``etag`` of ``bucket/key`` with ``tags`` (an upload, a
        retag)."""
        self._written[(bucket, key)] = (etag, dict(tags), trio.current_time())
        self._written.move_to_end((bucket, key))
        if len(self._written) > WRITTEN_KEPT:
            self._written.popitem(last=False)

    def known_tags(self, bucket: str, key: str, etag: str, vs) -> dict | None:
        """The tags of version ``etag`` when this mount wrote it (``wrote``) less than the
        view's ``ttl`` ago — a tag change by another client is seen within the staleness
        bound, as every change is — else None (ask S3)."""
        known = self._written.get((bucket, key))
        if known is None or vs is None or known[0] != etag \
                or trio.current_time() - known[2] >= vs.ttl:
            return None
        return dict(known[1])

    def forget(self, ino: int) -> None:
        self._cached.pop(ino, None)

    def clear(self) -> None:
        """Some object changed through this mount: read them all anew."""
        self._cached.clear()

    async def of(self, node: File) -> tuple[dict, dict]:
        """(tags, metadata) of ``node``."""
        vs = node.parent.view
        entry = self.cache.get(vs.bucket, node.key)
        if entry is not None and entry.dirty and not entry.meta.get("existing") and not node.etag:
            return final_tags(entry, vs, None), {}  # not uploaded yet: what it will get
        cached = self._cached.get(node.ino)
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
            tags = final_tags(entry, vs, tags)
        self._cached[node.ino] = (now, tags, metadata, node.etag)
        return tags, metadata

    async def object_tags(self, bucket: str, key: str, what: str) -> dict:
        """The tags of an object that must exist (ENOENT when it is gone)."""
        try:
            tags = await self.store.tags(bucket, key)
        except StoreError as exc:
            raise store_failure(exc, f"{what} (reading tags of)", bucket, key) from exc
        if tags is None:
            raise FsError(errno.ENOENT, f"{bucket}/{key}: no such object")
        return tags

    async def retag(self, node: File, add: dict, remove: tuple) -> None:
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
            current, _ = await self.of(node)
            for t in remove:
                if t not in current:
                    raise FsError(errno.ENODATA)
                tags.pop(t, None)
                untag.add(t)
            tags.update(add)
            untag -= set(add)
            try:
                self.written.update_record(entry, tags=tags, untag=sorted(untag))
            except StoreError as exc:
                raise store_failure(exc, "tagging", bucket, key) from exc
            self._cached.pop(node.ino, None)
            return
        current = await self.object_tags(bucket, key, "tagging")
        new = {**current, **add}
        for t in remove:
            if t not in new:
                raise FsError(errno.ENODATA)
            del new[t]
        try:
            await self.store.put_tags(bucket, key, new)
        except StoreError as exc:
            raise store_failure(exc, "tagging", bucket, key) from exc
        self._cached.clear()
        if node.etag:
            self.wrote(bucket, key, node.etag, new)
        if node.gone or node.key != key:
            return
        obj = {"key": key, "size": node.size, "mtime": node.mtime_ns / 1e9, "etag": node.etag}
        self.tree.local_put(bucket, key, obj, new, retag=True)
