"""`layout: {by: [...]}` with a real mount: directories by property values (which the
handler's listings and changes carry), files created in them tagged with those values,
moves between them retagging, and a retag by another S3 client moving the file."""
from __future__ import annotations

import os

import pytest

from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, handler, listdir, mounts, put  # noqa: F401
from .test_watch import WatchProcess

pytestmark = [pytest.mark.services, pytest.mark.fuse]


def tags_of(s3, bucket, key) -> dict:
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}


def test_layout_by_properties(mounts, bucket, s3):
    put(s3, bucket, "runs/a.fq", b"a", tags={"sample": "S1", "lane": "2"})
    put(s3, bucket, "runs/x/b.fq", b"b", tags={"sample": "S1"}, metadata={"lane": "3"})
    put(s3, bucket, "runs/c.fq", b"c", tags={"lane": "1"})
    mp = mounts.mount(f"""
    s:
      bucket: {bucket}
      object: "runs/*"
      layout: {{by: [sample, lane]}}
      ttl: 1s
    """)
    s = mp / "s"
    wait_until(lambda: listdir(s) == ["S1", "_unset"], CHANGE_TIMEOUT, "property directories")
    assert listdir(s / "S1") == ["2", "3"] and listdir(s / "_unset" / "1") == ["c.fq"]
    assert (s / "S1" / "3" / "x%2Fb.fq").read_bytes() == b"b"
    # created in S2/1: tagged sample=S2, lane=1
    os.makedirs(s / "S2" / "1")
    (s / "S2" / "1" / "new.fq").write_bytes(b"new")
    assert tags_of(s3, bucket, "runs/new.fq") == {"sample": "S2", "lane": "1"}
    assert listdir(s / "S2" / "1") == ["new.fq"]
    # moved to S1/2: retagged, no copy
    os.rename(s / "S2" / "1" / "new.fq", s / "S1" / "2" / "new.fq")
    assert tags_of(s3, bucket, "runs/new.fq") == {"sample": "S1", "lane": "2"}
    assert listdir(s / "S1" / "2") == ["a.fq", "new.fq"]
    assert (s / "S1" / "2" / "new.fq").read_bytes() == b"new"
    # `delvefs watch` prints the path below the property directories
    watch = WatchProcess(s, mounts.env)
    try:
        put(s3, bucket, "runs/w.fq", b"w", tags={"sample": "S3", "lane": "1"})
        assert watch.wait_lines(1, "the new file printed") == [str(s / "S3" / "1" / "w.fq")]
        assert (s / "S3" / "1" / "w.fq").read_bytes() == b"w"
    finally:
        watch.stop()
    # retagged by another S3 client: the handler logs it, the mount moves the file
    a = os.stat(s / "S1" / "2" / "a.fq").st_ino
    s3.put_object_tagging(Bucket=bucket, Key="runs/a.fq",
                          Tagging={"TagSet": [{"Key": "sample", "Value": "S9"}, {"Key": "lane", "Value": "2"}]})
    wait_until(lambda: listdir(s / "S9" / "2") == ["a.fq"], CHANGE_TIMEOUT, "the retagged file moved")
    assert listdir(s / "S1" / "2") == ["new.fq"]
    assert os.stat(s / "S9" / "2" / "a.fq").st_ino == a and (s / "S9" / "2" / "a.fq").read_bytes() == b"a"
    mounts.umount(mp)
