"""Fakes of the core's two collaborators: the event handler's API and S3.

They follow docs/API.md (versions, pages, change log with 410) and the StoreError
contract of delvefs.client.mount.s3async, and count calls so tests can assert what was asked.
"""
from __future__ import annotations

import errno
import hashlib
import time

import trio

from delvefs.client.mount.errors import Changed, StoreError, Superseded
from delvefs.client.handler.api import Resync
from delvefs.client.mount.writelog import WriteLog


class FakeHandler:
    """The handler's API (docs/API.md), and its outages: ``fail`` (unreachable: refused at
    once), ``hang`` (stopped: a request waits ``timeout`` seconds, as the client's would, or
    is answered as soon as ``hang`` is cleared), ``scanning`` (the bucket's first scan runs:
    listings are held ``scan_hold`` seconds, then answered 503 "scanning" with ``scan_listed``
    as progress; changes at once) and :meth:`lose_state` (404 for every view id until it is
    registered again; versions start anew, so older ones are 410).

    A view registered with ``layout_by`` gets ``properties`` in its listed objects and put
    changes, as the handler gives them: read from ``store`` (a FakeStore; tags, else user
    metadata) when the fake answers, unless the object was put with its own."""

    def __init__(self):
        self.views: dict[str, dict] = {}     # id -> state
        self.by_name: dict[str, str] = {}
        self.known: set[str] = set()         # ids registered since the state was lost
        self.calls = {"register": 0, "list": 0, "changes": 0}
        self.fail = False
        self.hang = False
        self.timeout = 20.0
        self.scanning = False
        self.scan_hold = 10.0
        self.scan_listed = 0
        self.store = None
        self.layouts: dict[str, tuple[str, tuple[str, ...]]] = {}  # id -> (bucket, layout_by)

    def _state(self, name: str) -> dict:
        vid = self.by_name.setdefault(name, f"id-{name}")
        return self.views.setdefault(vid, {"objects": {}, "version": 1, "log": [], "min": 0})

    def put(self, view: str, key: str, size: int = 0, etag: str | None = None, mtime: float = 1e9,
            properties: dict | None = None):
        """``properties``: what a layout view's change says (default: the store's, when listed)."""
        st = self._state(view)
        obj = {"key": key, "size": size, "mtime": mtime, "etag": etag or f"e-{key}-{size}"}
        if properties is not None:
            obj["properties"] = properties
        st["objects"][key] = obj
        st["version"] += 1
        st["log"].append({"v": st["version"], "op": "put", "key": key, "object": obj})

    def delete(self, view: str, key: str):
        st = self._state(view)
        st["objects"].pop(key, None)
        st["version"] += 1
        st["log"].append({"v": st["version"], "op": "delete", "key": key, "object": None})

    def truncate_log(self, view: str):
        """Forget the change log: clients behind get 410 (resync)."""
        st = self._state(view)
        st["log"].clear()
        st["min"] = st["version"]

    def lose_state(self):
        """A handler restarted on a new state directory: it knows no view (404) until one is
        registered again, and its versions start above every old one."""
        self.known.clear()
        for st in self.views.values():
            st["version"] += 1_000_000
            st["log"].clear()
            st["min"] = st["version"]

    async def _answer(self, view_id: str | None = None, *, listing: bool = False):
        """Fail (or wait) as the handler's state says, before an answer."""
        import trio

        from delvefs.client.handler.api import HandlerError, HandlerUnavailable
        deadline = trio.current_time() + self.timeout
        while self.hang:
            if trio.current_time() >= deadline:
                raise HandlerUnavailable("event handler at fake unreachable: ReadTimeout: timed out")
            await trio.sleep(0.05)
        if self.fail:
            raise HandlerUnavailable("fake handler down")
        if view_id is not None and view_id not in self.known:
            raise HandlerError(f"view {view_id}: HTTP 404 not_found: no view {view_id}", 404, "not_found")
        if self.scanning and view_id is not None:
            if listing:  # held while the scan runs, as with the client's `wait`
                with trio.move_on_after(self.scan_hold):
                    while self.scanning:
                        await trio.sleep(0.05)
            if self.scanning:
                raise HandlerUnavailable("listing: HTTP 503 scanning: still being built", 503, "scanning",
                                         {"error": "scanning", "listed": self.scan_listed})

    async def register(self, client, views, proof):
        await self._answer()
        self.calls["register"] += 1
        out = []
        for v in views:
            st = self._state(v["name"])
            self.known.add(self.by_name[v["name"]])
            if v["spec"].get("layout_by"):
                self.layouts[self.by_name[v["name"]]] = (v["spec"]["bucket"], tuple(v["spec"]["layout_by"]))
            out.append({"name": v["name"], "id": self.by_name[v["name"]], "version": st["version"]})
        return out

    async def wait_objects(self, bucket, objects, wait):
        """What the fake's views do not show yet of ``objects`` (a put: its ETag listed in
        some view; a delete: the key in none), at once: the fake has no event delay."""
        shown = {}
        for st in self.views.values():
            for key, obj in st["objects"].items():
                shown.setdefault(key, set()).add(obj["etag"])
        self.calls["wait_objects"] = self.calls.get("wait_objects", 0) + 1
        return [{**o, "seen": None} for o in objects
                if (o["etag"] is None and o["key"] in shown)
                or (o["etag"] is not None and o["etag"] not in shown.get(o["key"], ()))]

    async def list_page(self, view_id, after, limit=50000, *, hold=True, fresh=False):
        await self._answer(view_id, listing=hold)
        self.calls["list"] += 1
        st = self.views[view_id]
        keys = sorted((k for k in st["objects"] if after is None or k > after),
                      key=lambda k: k.encode())
        page = keys[:limit]
        return {"version": st["version"], "objects": [self._listed(view_id, st["objects"][k]) for k in page],
                "next": page[-1] if len(keys) > limit else None}

    async def changes(self, view_id, since, limit=50000, wait=0):
        await self._answer(view_id)
        self.calls["changes"] += 1
        st = self.views[view_id]
        if since < st["min"]:
            raise Resync(st["version"])
        newer = [c if c["object"] is None else {**c, "object": self._listed(view_id, c["object"])}
                 for c in st["log"] if c["v"] > since]
        return {"version": st["version"], "changes": newer[:limit], "more": len(newer) > limit}

    def _listed(self, view_id: str, obj: dict) -> dict:
        """``obj`` as listed: with its ``properties`` in a view registered with layout_by."""
        obj = dict(obj)
        layout = self.layouts.get(view_id)
        if layout is None or "properties" in obj:
            return obj
        bucket, names = layout
        o = self.store.objects.get((bucket, obj["key"])) if self.store is not None else None
        props = {}
        for source in (o["metadata"], o["tags"]) if o else ():  # a tag wins
            props.update((k.lower(), v) for k, v in source.items() if k.lower() in names)
        obj["properties"] = props
        return obj


class FakeStore:
    def __init__(self):
        self.objects: dict[tuple[str, str], dict] = {}
        self.calls = {"head": 0, "tags": 0, "download": 0, "revalidate": 0}
        self.wcalls = {"upload": 0, "copy": 0, "delete": 0, "put_tags": 0}
        self.conflicts = 0       # uploads refused by their condition
        self.part_size = 8 * 1024 * 1024   # files from this size on stream parts while written
        self.part_concurrency = 10
        self.multiparts: list = []
        self.copied_bytes = 0    # multipart uploads: bytes of parts copied server-side
        self.part_bytes = 0      # and of parts sent from a file
        self.delete_batches = 0
        self.deleted: list[list[str]] = []   # every DeleteObjects batch's keys
        self.fail_writes: int | None = None  # errno for upload/copy/delete/put_tags (S3 down)
        self.multipart_copy_size: int | None = None  # copies this big get an ETag of their own
        self.uploaded: list[dict] = []       # every upload: key, tags, content_type, data
        self.gets: list[tuple[str, int, int]] = []  # every ranged GET: key, start, end
        self.chunk = 64 * 1024   # ranged GETs: bytes per ``write`` (a trio checkpoint each)
        self.fail_at = None      # a GET reaching this offset fails there (EIO) after the bytes before it
        self.gate = None         # a trio.Event: GETs wait for it before answering
        self.manifests: list[dict] = []  # every publish manifest written (put_small)
        self.written = WriteLog()  # as S3Store's: what S3 accepted
        self.lists = 0           # ListObjectsV2 requests
        self.unreachable = False  # S3 down: every read-side request is refused at once
        self.heads_once = 0      # HEADs asked in one try (``once``: no retries)
        self.revalidations_once = 0  # conditional GETs (get_if_changed) asked in one try

    def put(self, bucket: str, key: str, data: bytes, *, tags=None, metadata=None, mtime=1e9) -> dict:
        etag = hashlib.md5(data).hexdigest()
        self.objects[(bucket, key)] = {"data": data, "etag": etag, "mtime": mtime,
                                       "tags": dict(tags or {}), "metadata": dict(metadata or {})}
        return {"key": key, "size": len(data), "etag": etag, "mtime": mtime}

    def _get(self, bucket, key):
        if self.unreachable:
            raise StoreError(errno.EIO, f"{bucket}/{key}: ConnectionRefusedError: [Errno 111] "
                             "Connection refused", unreachable=True)
        try:
            return self.objects[(bucket, key)]
        except KeyError:
            raise StoreError(errno.ENOENT, f"{bucket}/{key}: no such object") from None

    async def head(self, bucket, key, *, once=False):
        self.calls["head"] += 1
        self.heads_once += once
        o = self._get(bucket, key)
        return {"etag": o["etag"], "size": len(o["data"]), "mtime": o["mtime"], "metadata": o["metadata"]}

    async def get_if_changed(self, bucket, key, start, end, *, etag, once=False):
        """A ranged GET with If-None-Match (S3Store.get_if_changed): None when ``etag`` is
        the object's version, else its facts and bytes [start, end)."""
        self.calls["revalidate"] += 1
        self.revalidations_once += once
        o = self._get(bucket, key)
        if o["etag"] == etag:
            return None
        data = o["data"]
        return {"etag": o["etag"], "size": len(data), "mtime": o["mtime"],
                "metadata": o["metadata"], "start": start, "data": bytes(data[start:end])}

    async def tags(self, bucket, key):
        self.calls["tags"] += 1
        return dict(self._get(bucket, key)["tags"])

    async def get_range(self, bucket, key, start, end, *, etag, write):
        import trio
        self.calls["download"] += 1
        self.gets.append((key, start, end))
        if self.gate is not None:
            await self.gate.wait()
        o = self._get(bucket, key)
        if o["etag"] != etag:
            raise Changed(f"GET {bucket}/{key}: 412")
        data = o["data"]
        if end > len(data):
            raise Changed(f"GET {bucket}/{key}: InvalidRange {start}-{end - 1}")  # (as store_error maps it)
        for pos in range(start, end, self.chunk):
            stop = min(end, pos + self.chunk)
            if self.fail_at is not None and pos <= self.fail_at < end:
                stop = min(stop, self.fail_at)
                if stop > pos:
                    write(pos, memoryview(data)[pos:stop])
                raise StoreError(errno.EIO, f"GET {bucket}/{key}: connection reset at {self.fail_at}")
            write(pos, memoryview(data)[pos:stop])
            await trio.sleep(0)

    # --- write side
    def _check_write(self, what):
        if self.fail_writes is not None:
            raise StoreError(self.fail_writes, f"{what}: fake S3 refuses")

    def multipart(self, bucket, key, *, tags, content_type):
        return FakeMultipart(self, bucket, key, tags, content_type)

    async def upload(self, bucket, key, filename, *, size, tags, content_type, base=None, metadata=None,
                     superseded=None):
        self.wcalls["upload"] += 1
        self._check_write(f"PUT {bucket}/{key}")
        if superseded is not None and size >= self.part_size and superseded():
            raise Superseded(f"PUT {bucket}/{key}: given up")  # as before a part of S3Store's
        current = self.objects.get((bucket, key))
        if base is not None and (current["etag"] if current else "") != base:
            self.conflicts += 1  # S3's answer to If-Match / If-None-Match: * (412)
            raise Changed(f"PUT {bucket}/{key}: S3 has another version")
        with open(filename, "rb") as f:
            data = f.read()
        obj = self.put(bucket, key, data, tags=tags, metadata=metadata, mtime=time.time())
        self.objects[(bucket, key)]["content_type"] = content_type
        self.uploaded.append({"bucket": bucket, "key": key, "tags": dict(tags or {}),
                              "content_type": content_type, "data": data})
        self.written.wrote(bucket, key, obj["etag"], time.time())
        return {"etag": obj["etag"], "size": obj["size"], "mtime": None}

    async def copy(self, bucket, key, src_bucket, src_key, *, src_etag=None, metadata=None):
        self.wcalls["copy"] += 1
        self._check_write(f"COPY {src_bucket}/{src_key}")
        o = self._get(src_bucket, src_key)
        if src_etag is not None and o["etag"] != src_etag:
            raise Changed(f"COPY {src_bucket}/{src_key}: 412")
        meta = dict(o["metadata"], **(metadata or {}))
        o = dict(o, tags=dict(o["tags"]), metadata=meta)
        if self.multipart_copy_size is not None and len(o["data"]) >= self.multipart_copy_size:
            o["etag"] = hashlib.md5(o["etag"].encode()).hexdigest() + "-2"  # as a multipart copy's
        self.objects[(bucket, key)] = o
        self.written.wrote(bucket, key, o["etag"], o["mtime"])
        return {"etag": o["etag"], "size": len(o["data"]), "mtime": o["mtime"], "metadata": meta}

    async def put_small(self, bucket, key, body, *, metadata):
        self.wcalls["upload"] += 1
        self._check_write(f"PUT {bucket}/{key}")
        self.manifests.append({"bucket": bucket, "key": key, "metadata": dict(metadata)})
        return self.put(bucket, key, body, metadata=metadata)["etag"]

    async def delete(self, bucket, key):
        self.wcalls["delete"] += 1
        self._check_write(f"DELETE {bucket}/{key}")
        self.objects.pop((bucket, key), None)
        self.written.wrote(bucket, key, None, 0.0)

    async def delete_many(self, bucket, keys):
        self.delete_batches += 1
        if self.fail_writes is not None:
            return {k: StoreError(self.fail_writes, f"DELETE {bucket}/{k}: fake S3 refuses") for k in keys}
        self.deleted.append(list(keys))
        for k in keys:
            self.objects.pop((bucket, k), None)
            self.written.wrote(bucket, k, None, 0.0)
        return {}

    async def list_level(self, bucket, prefix, continuation=None):
        """All of one level at once (the fake never pages)."""
        self.lists += 1
        objects, prefixes = [], []
        for (b, k), o in sorted(self.objects.items()):
            if b != bucket or not k.startswith(prefix):
                continue
            rest = k[len(prefix):]
            if "/" in rest:
                sub = prefix + rest.split("/", 1)[0] + "/"
                if sub not in prefixes:
                    prefixes.append(sub)
            else:
                objects.append({"key": k, "size": len(o["data"]), "etag": o["etag"]})
        return {"objects": objects, "prefixes": prefixes, "next": None}

    async def put_tags(self, bucket, key, tags):
        self.wcalls["put_tags"] += 1
        self._check_write(f"PutObjectTagging {bucket}/{key}")
        self._get(bucket, key)["tags"] = dict(tags)


class FakeMultipart:
    """A multipart upload of the fake S3 (the interface of ``s3async.Multipart``)."""

    def __init__(self, store, bucket, key, tags, content_type):
        import trio
        self.store, self.bucket, self.key = store, bucket, key
        self.tags, self.content_type = tags, content_type
        self.parts: dict[int, bytes] = {}
        self.sent: list[int] = []          # part numbers, in the order they were sent
        self.copied: list[tuple[int, int, int]] = []  # UploadPartCopy: (number, start, end)
        self.errors: list = []
        self.what = f"PUT {bucket}/{key} (multipart)"
        self.aborted = False
        self.upload_id = None
        self._slots = trio.Semaphore(store.part_concurrency)
        store.multiparts.append(self)

    def try_slot(self):
        import trio
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            return False
        return True

    async def wait_slot(self):
        await self._slots.acquire()

    async def send_copy(self, number, source, start, end):
        """UploadPartCopy of bytes [start, end) of ``source`` = (bucket, key, etag), pinned
        to the ETag (x-amz-copy-source-if-match)."""
        import trio
        try:
            await trio.sleep(0)
            if self.store.fail_writes is not None:
                self.errors.append(StoreError(self.store.fail_writes, f"{self.what}: fake S3 refuses"))
                return None
            o = self.store.objects.get(source[:2])
            if o is None:
                self.errors.append(StoreError(errno.ENOENT, f"{source[0]}/{source[1]}: no such object"))
                return None
            if o["etag"] != source[2] or end > len(o["data"]):
                self.errors.append(Changed(f"{self.what} part {number}: 412 (copy source)"))
                return None
            data = o["data"][start:end]
            self.upload_id = self.upload_id or "fake-upload"
            self.parts[number] = data
            self.sent.append(number)
            self.copied.append((number, start, end))
            self.store.copied_bytes += end - start
            return hashlib.md5(data).hexdigest()
        finally:
            self._slots.release()

    async def send_part(self, number, filename, offset, length):
        import trio
        try:
            await trio.sleep(0)
            if self.store.fail_writes is not None:
                self.errors.append(StoreError(self.store.fail_writes, f"{self.what}: fake S3 refuses"))
                return None
            with open(filename, "rb") as f:
                f.seek(offset)
                data = f.read(length)
            self.upload_id = self.upload_id or "fake-upload"
            self.parts[number] = data
            self.sent.append(number)
            self.store.part_bytes += len(data)
            return hashlib.md5(data).hexdigest()
        finally:
            self._slots.release()

    async def complete(self, size, base, parts):
        data = b"".join(self.parts[n] for n in range(1, len(parts) + 1))
        assert [hashlib.md5(self.parts[n]).hexdigest() for n in range(1, len(parts) + 1)] == parts
        current = self.store.objects.get((self.bucket, self.key))
        if base is not None and (current["etag"] if current else "") != base:
            self.store.conflicts += 1
            raise Changed(f"PUT {self.bucket}/{self.key}: S3 has another version")
        obj = self.store.put(self.bucket, self.key, data, tags=self.tags)
        self.upload_id = None
        self.store.uploaded.append({"bucket": self.bucket, "key": self.key, "tags": dict(self.tags or {}),
                                    "content_type": self.content_type, "data": data})
        self.store.written.wrote(self.bucket, self.key, obj["etag"], time.time())
        return obj["etag"]

    async def abort(self):
        self.aborted = True


class RecordingNotifier:
    def __init__(self):
        self.entries: list[tuple[int, str]] = []
        self.inodes: list[int] = []

    def entry(self, parent_ino, name):
        self.entries.append((parent_ino, name))

    def inode(self, ino):
        self.inodes.append(ino)


def held(store, method: str) -> tuple[trio.Event, trio.Event]:
    """Make ``store.method`` wait: (called, release) — ``called`` is set when a call came,
    the call goes on once ``release`` is set."""
    called, release, real = trio.Event(), trio.Event(), getattr(store, method)

    async def waiting(*args, **kw):
        called.set()
        await release.wait()
        return await real(*args, **kw)
    setattr(store, method, waiting)
    return called, release
