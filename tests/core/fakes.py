"""Fakes of the core's two collaborators: the event handler's API and S3.

They follow docs/API.md (versions, pages, change log with 410) and the StoreError
contract of delvefs.client.s3async, and count calls so tests can assert what was asked.
"""
from __future__ import annotations

import errno
import hashlib
import itertools

from delvefs.client.errors import Changed, StoreError
from delvefs.client.handler_api import Resync


class FakeHandler:
    def __init__(self):
        self.views: dict[str, dict] = {}     # id -> state
        self.by_name: dict[str, str] = {}
        self.calls = {"register": 0, "list": 0, "changes": 0}
        self.fail = False
        self.scanning = False  # answer as while the bucket's first scan runs (503 scanning)

    def _state(self, name: str) -> dict:
        vid = self.by_name.setdefault(name, f"id-{name}")
        return self.views.setdefault(vid, {"objects": {}, "version": 1, "log": [], "min": 0})

    def put(self, view: str, key: str, size: int = 0, etag: str | None = None, mtime: float = 1e9):
        st = self._state(view)
        obj = {"key": key, "size": size, "mtime": mtime, "etag": etag or f"e-{key}-{size}"}
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

    def _check(self, reading: bool = True):
        from delvefs.client.handler_api import HandlerUnavailable
        if self.fail:
            raise HandlerUnavailable("fake handler down")
        if self.scanning and reading:
            raise HandlerUnavailable("listing: HTTP 503 scanning: still being built", 503, "scanning")

    async def register(self, client, views, proof):
        self._check(reading=False)
        self.calls["register"] += 1
        out = []
        for v in views:
            st = self._state(v["name"])
            out.append({"name": v["name"], "id": self.by_name[v["name"]], "version": st["version"]})
        return out

    async def list_page(self, view_id, after, limit=50000):
        self._check()
        self.calls["list"] += 1
        st = self.views[view_id]
        keys = sorted((k for k in st["objects"] if after is None or k > after),
                      key=lambda k: k.encode())
        page = keys[:limit]
        return {"version": st["version"], "objects": [dict(st["objects"][k]) for k in page],
                "next": page[-1] if len(keys) > limit else None}

    async def changes(self, view_id, since, limit=50000, wait=0):
        self._check()
        self.calls["changes"] += 1
        st = self.views[view_id]
        if since < st["min"]:
            raise Resync(st["version"])
        newer = [c for c in st["log"] if c["v"] > since]
        return {"version": st["version"], "changes": newer[:limit], "more": len(newer) > limit}


class FakeStore:
    def __init__(self):
        self.objects: dict[tuple[str, str], dict] = {}
        self.calls = {"head": 0, "tags": 0, "download": 0}
        self.wcalls = {"upload": 0, "copy": 0, "delete": 0, "put_tags": 0}
        self.fail_writes: int | None = None  # errno for upload/copy/delete/put_tags (S3 down)
        self.uploaded: list[dict] = []       # every upload: key, tags, content_type, data
        self.chunk = 1000        # streaming downloads: bytes per write
        self.shuffle = False     # write odd chunks first
        self.fail_after = None   # fail a streaming download at this offset
        self.progress: list[int] = []

    def put(self, bucket: str, key: str, data: bytes, *, tags=None, metadata=None, mtime=1e9) -> dict:
        etag = hashlib.md5(data).hexdigest()
        self.objects[(bucket, key)] = {"data": data, "etag": etag, "mtime": mtime,
                                       "tags": dict(tags or {}), "metadata": dict(metadata or {})}
        return {"key": key, "size": len(data), "etag": etag, "mtime": mtime}

    def _get(self, bucket, key):
        try:
            return self.objects[(bucket, key)]
        except KeyError:
            raise StoreError(errno.ENOENT, f"{bucket}/{key}: no such object") from None

    async def head(self, bucket, key):
        self.calls["head"] += 1
        o = self._get(bucket, key)
        return {"etag": o["etag"], "size": len(o["data"]), "mtime": o["mtime"], "metadata": o["metadata"]}

    async def tags(self, bucket, key):
        self.calls["tags"] += 1
        return dict(self._get(bucket, key)["tags"])

    async def download(self, bucket, key, filename, *, etag, size):
        self.calls["download"] += 1
        o = self._get(bucket, key)
        if o["etag"] != etag:
            raise Changed(f"{bucket}/{key}: 412")
        if isinstance(filename, str):
            with open(filename, "wb") as f:
                f.write(o["data"])
            return
        # a file object (streaming download): parts out of order, one chunk per step
        import trio
        data, chunk = o["data"], self.chunk
        starts = list(range(0, len(data), chunk))
        order = starts[1::2] + starts[0::2] if self.shuffle else starts
        for start in order:
            if self.fail_after is not None and start >= self.fail_after:
                raise Changed(f"{bucket}/{key}: 412 mid-way")
            filename.seek(start)
            filename.write(data[start:start + chunk])
            self.progress.append(start)
            await trio.sleep(0)


    # --- write side
    def _check_write(self, what):
        if self.fail_writes is not None:
            raise StoreError(self.fail_writes, f"{what}: fake S3 refuses")

    async def upload(self, bucket, key, filename, *, size, tags, content_type):
        self.wcalls["upload"] += 1
        self._check_write(f"PUT {bucket}/{key}")
        with open(filename, "rb") as f:
            data = f.read()
        import time
        obj = self.put(bucket, key, data, tags=tags, mtime=time.time())
        self.objects[(bucket, key)]["content_type"] = content_type
        self.uploaded.append({"bucket": bucket, "key": key, "tags": dict(tags or {}),
                              "content_type": content_type, "data": data})
        return {"etag": obj["etag"], "size": obj["size"], "mtime": None}

    async def copy(self, bucket, key, src_bucket, src_key):
        self.wcalls["copy"] += 1
        self._check_write(f"COPY {src_bucket}/{src_key}")
        o = self._get(src_bucket, src_key)
        self.objects[(bucket, key)] = dict(o, tags=dict(o["tags"]))
        return {"etag": o["etag"], "size": len(o["data"]), "mtime": o["mtime"], "metadata": o["metadata"]}

    async def delete(self, bucket, key):
        self.wcalls["delete"] += 1
        self._check_write(f"DELETE {bucket}/{key}")
        self.objects.pop((bucket, key), None)

    async def put_tags(self, bucket, key, tags):
        self.wcalls["put_tags"] += 1
        self._check_write(f"PutObjectTagging {bucket}/{key}")
        self._get(bucket, key)["tags"] = dict(tags)


class RecordingNotifier:
    def __init__(self):
        self.entries: list[tuple[int, str]] = []
        self.inodes: list[int] = []

    def entry(self, parent_ino, name):
        self.entries.append((parent_ino, name))

    def inode(self, ino):
        self.inodes.append(ino)
