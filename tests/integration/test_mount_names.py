"""Which keys a real mount shows, by the rules of docs/SEMANTICS.md ("Which keys are shown"):
a key with a NUL byte is skipped in every layout (counted by ``delvefs status``), a flat name
over 255 bytes is cut and hashed and reaches its key; nothing else is listed."""
from __future__ import annotations

import json
import os
import time

import pytest

from delvefs.client.mount.fs.inodes import NAME_MAX, flat_name, is_cut
from delvefs.shared.s3 import presigned_list_url
from eventhandler.devtools import Publisher, spec

from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, handler, listdir, mounts, put  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]

LONG_REL = "/".join(["s" * 90] * 3) + "/end.txt"   # segments S3 stores; a 303-byte flat name


def unshown(mounts, mp) -> dict:
    """Each view's count of keys not shown, once both views are refreshed (a listing asks)."""
    listdir(mp / "tree"), listdir(mp / "flat")
    r = mounts.run("status", str(mp), "--json")
    assert r.returncode == 0, r.stderr
    return {v["name"]: v["unshown"] for v in json.loads(r.stdout)["views"]}


def test_a_nul_key_is_skipped_and_a_long_flat_name_is_cut(mounts, handler, bucket, s3, services):
    put(s3, bucket, "data/" + LONG_REL, b"long")
    put(s3, bucket, "data/ok.txt", b"ok")
    mp = mounts.mount(f"""
    tree:
      bucket: {bucket}
      object: "data/*"
      ttl: 1s
    flat:
      bucket: {bucket}
      object: "data/*"
      layout: flat
      writable: true
      ttl: 1s
    """)
    cut = flat_name(LONG_REL)
    assert is_cut(cut) and len(cut.encode()) <= NAME_MAX
    wait_until(lambda: listdir(mp / "flat") == sorted(["ok.txt", cut]), CHANGE_TIMEOUT, "the listing")
    # a key with a NUL byte (AWS S3 allows it, MinIO's store does not): its event as MinIO sends one
    pub = Publisher(services.rabbit.url)
    try:
        pub.publish("s3:ObjectCreated:Put", bucket, "data/nul\0tail.txt", time.time_ns(), size=3, etag="e")
    finally:
        pub.close()
    wait_until(lambda: unshown(mounts, mp) == {"tree": 1, "flat": 1}, CHANGE_TIMEOUT,
               "the key with a NUL byte reached the mount and was skipped")
    # the handler lists the key as it is, also as a page's end (the next page's `after`)
    r = handler.register({"all": spec(bucket, object="data/*")}, {bucket: presigned_list_url(s3, bucket)})
    vid = r.json()["views"][0]["id"]
    assert [[o["key"] for o in page["objects"]] for page in handler.pages(vid, limit=1)][:3] == [
        ["data/nul\0tail.txt"], ["data/ok.txt"], ["data/" + LONG_REL]]
    assert listdir(mp / "tree") == ["ok.txt", "s" * 90]
    assert listdir(mp / "flat") == sorted(["ok.txt", cut])
    # the cut name reaches its key: lookup, read, the key's xattr, a write
    long_path = mp / "flat" / cut
    assert long_path.read_bytes() == b"long"
    assert os.getxattr(long_path, "user.delvefs.key") == ("data/" + LONG_REL).encode()
    long_path.write_bytes(b"written")
    assert s3.get_object(Bucket=bucket, Key="data/" + LONG_REL)["Body"].read() == b"written"
    assert (mp / "tree" / LONG_REL).read_bytes() == b"written"
    assert listdir(mp / "flat") == sorted(["ok.txt", cut])
    mounts.umount(mp)
