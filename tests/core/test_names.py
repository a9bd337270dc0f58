"""Which keys a view shows under which name, and which it skips (docs/SEMANTICS.md, "Which
keys are shown"): a key is shown by the one name its layout gives it, or skipped — counted
in ``delvefs status`` and logged once per key — never shown under a wrong name."""
from __future__ import annotations

import errno
import logging
import os

import pytest

from delvefs.client.mount.errors import FsError
from delvefs.client.mount.fs.inodes import NAME_MAX, flat_name, is_cut, relative_path, unshowable
from delvefs.client.commands.status import format_mount
from delvefs.client.mount.report import views_report

from .conftest import view

pytestmark = pytest.mark.trio

LONG_REL = "/".join(["s" * 90] * 3) + "/end.txt"   # its flat name: 303 bytes before it is cut
ODD_KEYS = {
    "data/nul\0tail.txt": "a NUL byte",
    "data/a//b": "an empty segment",
    "/data/x": None,                       # outside the root: not the view's
    "data/./dot": "a '.' segment",
    "data/up/../x": "a '..' segment",
    "data/" + "n" * 256: "a segment longer than 255 bytes",
    "data/" + LONG_REL: None,              # segments of 90 bytes: a tree path
    "data/ok.txt": None,
}


def not_shown_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not shown" in r.getMessage()]


async def test_keys_without_a_name_are_skipped_counted_and_logged_once(make_world, mock_clock, caplog):
    caplog.set_level(logging.WARNING, "delvefs.client.mount.fs.tree")
    w = make_world(view("t", object="data/*"), view("f", object="data/*", layout="flat"))
    for key in ODD_KEYS:
        w.add("t", key, key.encode())
        w.add("f", key, key.encode())
    await w.start()
    # tree: every key with a tree path, nothing else (no name cut at a NUL byte)
    assert sorted(await w.names("t")) == ["ok.txt", "s" * 90]
    assert await w.read("t/" + LONG_REL) == ("data/" + LONG_REL).encode()
    # flat: every key but the one with a NUL byte
    flat = sorted(await w.names("f"))
    assert flat == sorted(flat_name(k[len("data/"):]) for k in ODD_KEYS
                          if k.startswith("data/") and "\0" not in k)
    assert all(len(n.encode()) <= NAME_MAX and "/" not in n and "\0" not in n for n in flat)
    t, f = w.fs.catalog.by_name["t"], w.fs.catalog.by_name["f"]
    assert {k: r.split(" (")[0] for k, r in t.unshown.items()} == {
        k: r for k, r in ODD_KEYS.items() if r is not None}
    assert list(f.unshown) == ["data/nul\0tail.txt"]
    assert len(not_shown_log(caplog)) == 6            # once per key and view
    # counted in `delvefs status`
    report = {v["name"]: v["unshown"] for v in views_report(w.fs)}
    assert report == {"t": 5, "f": 1}
    status = {"mountpoint": "/m", "pid": 1, "handler": "h", "views": views_report(w.fs),
              "files": [], "counts": {}, "cache_dir": "/c",
              "cache": {"bytes": 0, "limit": None, "entries": 0, "dirty_bytes": 0}}
    assert "NOT SHOWN" in format_mount(status)
    # the next delta and a relist change nothing: logged once per key, not per listing
    w.add("t", "data/nul\0tail.txt", b"again")
    w.handler.truncate_log("f")
    mock_clock.jump(3)
    assert sorted(await w.names("t")) == ["ok.txt", "s" * 90]
    assert sorted(await w.names("f")) == flat
    assert len(not_shown_log(caplog)) == 6 and len(t.unshown) == 5 and len(f.unshown) == 1
    # gone from S3: no longer counted (a delta's delete, a relist's sweep)
    w.remove("t", "data/nul\0tail.txt")
    w.remove("f", "data/nul\0tail.txt")
    w.handler.truncate_log("f")
    mock_clock.jump(3)
    await w.names("t")
    await w.names("f")
    assert "data/nul\0tail.txt" not in t.unshown and f.unshown == {}


async def test_the_rules_of_names_per_layout():
    assert unshowable("a\0b", flat=True) and unshowable("a\0b", flat=False)
    for rel in ["a//b", "/a", "a/./b", "a/..", "./", "x" * 256 + "/y"]:
        assert unshowable(rel, flat=False), rel
        assert unshowable(rel, flat=True) is None, rel   # escaped in a flat name
    for rel in ["a", "a/b", "a/b/", "é" * 127]:
        assert unshowable(rel, flat=False) is None, rel
    assert flat_name(".") == "%2E" and flat_name("..") == "%2E%2E" and flat_name("a//b") == "a%2F%2Fb"
    tree = {"root": "data/", "layout": "tree"}
    assert relative_path(tree, "data/a\0b") is None and relative_path(tree, "data/a//b") is None
    assert relative_path({**tree, "layout": "flat"}, "data/a//b") == "a%2F%2Fb"


async def test_long_flat_names_are_cut_and_hashed_reversibly(make_world):
    w = make_world(view("f", object="data/*", layout="flat", writable=True))
    twin = LONG_REL[:-len("end.txt")] + "other.txt"   # the same first 200 bytes
    w.add("f", "data/" + LONG_REL, b"long")
    w.add("f", "data/" + twin, b"twin")
    await w.start()
    name, other = flat_name(LONG_REL), flat_name(twin)
    assert is_cut(name) and len(name.encode()) <= NAME_MAX and name != other
    assert name.encode()[:200] == other.encode()[:200]
    assert sorted(await w.names("f")) == sorted([name, other])
    # lookups, reads, the key's xattr and writes reach the key the name was cut from
    node = await w.path(f"f/{name}")
    assert node.key == "data/" + LONG_REL
    assert await w.fs.getxattr(node.ino, "user.delvefs.key") == ("data/" + LONG_REL).encode()
    assert await w.read(f"f/{name}") == b"long" and await w.read(f"f/{other}") == b"twin"
    await w.write(f"f/{name}", b"written", flags=os.O_WRONLY | os.O_TRUNC)
    assert w.obj("f", "data/" + LONG_REL)["data"] == b"written"
    assert w.obj("f", "data/" + twin)["data"] == b"twin"
    # renamed to a short name: the right object is moved
    top = await w.path("f")
    await w.fs.rename(top.ino, other, top.ino, "short.txt")
    assert w.obj("f", "data/short.txt")["data"] == b"twin" and w.obj("f", "data/" + twin) is None
    # a cut name the mount never made names no key
    stranger = name[:-16] + "0" * 16
    with pytest.raises(FsError) as err:
        await w.fs.create(top.ino, stranger, os.O_WRONLY | os.O_CREAT)
    assert err.value.errno == errno.EINVAL
