"""Extended attributes: an object's tags, metadata and facts; a view's info and sync.

``user.<tag>`` is the object's tag (set/removed with PutObjectTagging, merged with the
current tag set; the file moves into and out of this mount's views at once),
``user.meta.<name>`` its user metadata (read-only), ``user.delvefs.etag`` / ``bucket`` /
``key`` facts. A view's top directory answers ``user.delvefs.view`` (``delvefs watch``)
and ``user.delvefs.stale`` (whether the handler gave the last refresh: "0", or "1 since
<time>: <reason>"), and accepts ``user.delvefs.sync`` (wait for a handler version). A file not yet in S3 as
written answers ``user.delvefs.upload``: ``waiting`` (an eager mount's write-back delay),
``pending``, ``uploading``, ``failed: <reason>``
or ``conflict: <reason>`` (absent once uploaded). A file whose cached copy an open was
served although S3 could not be asked whether it is current (stale-if-error,
``delvefs.client.mount.fs.reads``) answers ``user.delvefs.unconfirmed``: "since <time>:
S3 could not be asked: <reason>" (absent once S3 answers an open's revalidation again).
Other namespaces (security.*, system.*, trusted.*) are not supported.
"""
from __future__ import annotations

import errno
import json

from ..errors import FsError
from .catalog import ViewState, stale_text
from .inodes import File, InodeTable
from .properties import Properties
from .written import WrittenFiles
from .listings import Listings


class Xattrs:
    """The extended attribute operations."""

    FACTS = ("user.delvefs.etag", "user.delvefs.bucket", "user.delvefs.key")
    VIEW_ATTRIBUTES = ["user.delvefs.view", "user.delvefs.stale"]

    def __init__(self, table: InodeTable, listings: Listings, properties: Properties,
                 written: WrittenFiles, cache, handler, unconfirmed=None):
        self.table = table
        self.unconfirmed = unconfirmed  # reads.Unconfirmed: copies served unconfirmed
        self.listings = listings
        self.properties = properties
        self.written = written
        self.cache = cache
        self.handler = handler  # the handler client: which shard and URL serve a view

    def _upload_text(self, node: File) -> str | None:
        """``user.delvefs.upload`` of a file: None when S3 has it as shown (clean)."""
        entry = self.cache.get(node.parent.view.bucket, node.key)
        if entry is None or not entry.dirty or entry.meta is None:
            return None
        state, reason = self.written.upload_state(entry)
        return f"{state}: {reason}" if reason else state

    def _unconfirmed_text(self, node: File) -> str | None:
        """``user.delvefs.unconfirmed`` of a file: None unless its version's cached copy is
        served without S3's confirmation."""
        if self.unconfirmed is None or not node.etag:
            return None
        return self.unconfirmed.text(node.parent.view.bucket, node.key, node.etag)

    def view_info(self, vs: ViewState) -> dict:
        """What ``user.delvefs.view`` on a view's directory answers (delvefs watch):
        ``handler`` the URL of the handler serving the view (its bucket's shard's, the one
        that answered last), ``shard`` that shard's name (None without a map), ``handlers``
        the mount's whole handler setting (its URLs, or the shard map: what ``delvefs
        watch`` follows moves and failovers with); its ``layout`` is "tree", "flat" or "by"
        (then ``layout_by``: the property names, one directory level each, in order)."""
        serving = getattr(self.handler, "serving", None)
        shard, url = serving(vs.bucket) if serving is not None else (None, None)
        info = {"id": vs.listing.id, "name": vs.name, "handler": url, "shard": shard,
                "handlers": getattr(self.handler, "base_url", None), "bucket": vs.bucket,
                "root": vs.root, "layout": "by" if vs.by else "flat" if vs.flat else "tree",
                "version": vs.listing.version}
        if vs.by:
            info["layout_by"] = list(vs.by)
        return info

    async def getxattr(self, ino: int, name: str) -> bytes:
        node = self.table.require(ino)
        if not name.startswith("user."):
            # security.*, system.posix_acl_*, trusted.*: not supported here. ENOTSUP (not
            # ENODATA) lets tools such as ls -l stop asking for every further file.
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir:
            vs = node.view
            if vs is not None and node is vs.top and name == "user.delvefs.view":
                if not vs.listing.listed:  # a version means something once the view is listed
                    await self.listings.fresh(vs)
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
        if name == "user.delvefs.unconfirmed":  # asks nothing of S3 (it may be down)
            text = self._unconfirmed_text(node)
            if text is None:
                raise FsError(errno.ENODATA)
            return text.encode()
        if name == "user.delvefs.etag":
            return node.etag.encode()
        if name == "user.delvefs.bucket":
            return vs.bucket.encode()
        if name == "user.delvefs.key":
            return node.key.encode("utf-8", "surrogateescape")
        tags, metadata = await self.properties.of(node)
        if name.startswith("user.meta."):
            value = metadata.get(name[len("user.meta."):].lower())
        else:
            value = tags.get(name[len("user."):])
        if value is None:
            raise FsError(errno.ENODATA)
        return value.encode("utf-8", "surrogateescape")

    async def listxattr(self, ino: int) -> list[str]:
        node = self.table.require(ino)
        if node.is_dir:
            vs = node.view
            return list(self.VIEW_ATTRIBUTES) if vs is not None and node is vs.top else []
        tags, metadata = await self.properties.of(node)
        upload = ["user.delvefs.upload"] if self._upload_text(node) is not None else []
        if self._unconfirmed_text(node) is not None:
            upload.append("user.delvefs.unconfirmed")
        return ([*self.FACTS] + upload + [f"user.{t}" for t in sorted(tags)]
                + [f"user.meta.{m}" for m in sorted(metadata)])

    async def setxattr(self, ino: int, name: str, value: bytes) -> None:
        node = self.table.require(ino)
        if not name.startswith("user."):
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir:
            vs = node.view
            if vs is not None and node is vs.top and name == "user.delvefs.sync":
                await self.listings.sync(vs, value)
                return
            raise FsError(errno.EPERM, "directories have no tags")
        if name.startswith(("user.delvefs.", "user.meta.")):
            raise FsError(errno.EPERM, f"{name} is read-only")
        await self.properties.retag(node, {name[len("user."):]: value.decode("utf-8", "surrogateescape")}, ())

    async def removexattr(self, ino: int, name: str) -> None:
        node = self.table.require(ino)
        if not name.startswith("user."):
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir or name.startswith(("user.delvefs.", "user.meta.")):
            raise FsError(errno.EPERM, f"{name} is read-only")
        await self.properties.retag(node, {}, (name[len("user."):],))
