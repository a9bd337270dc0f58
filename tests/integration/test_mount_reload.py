"""A views file that changes without a remount, with a real mount: `delvefs reload MOUNT`
and SIGHUP make the mount read it again; a broken file changes nothing."""
from __future__ import annotations

import os
import signal
import textwrap

import pytest

from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, data_views, handler, listdir, mounts, put  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]


def test_reload_and_sighup_change_the_views_and_a_broken_file_changes_nothing(mounts, bucket, s3):
    put(s3, bucket, "data/a.txt", b"a")
    put(s3, bucket, "data/sub/b.txt", b"b")
    put(s3, bucket, "more/m.txt", b"m")
    mp = mounts.mount(data_views(bucket))
    views_file = mounts.tmp / f"views-{mounts.count}.yaml"
    wait_until(lambda: listdir(mp / "data") == ["a.txt", "sub"], CHANGE_TIMEOUT, "data listed")
    with open(mp / "data" / "a.txt", "rb") as kept_open:  # in a view about to change
        # data changes (only data/sub/), raw goes, more comes
        views_file.write_text(textwrap.dedent(f"""
        data:
          bucket: {bucket}
          object: "data/sub/*"
          ttl: 1s
        more:
          bucket: {bucket}
          object: "more/*"
          ttl: 1s
        """))
        r = mounts.run("reload", str(mp))
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["added more", "removed raw", "changed data"]
        assert listdir(mp) == ["data", "more"]
        wait_until(lambda: listdir(mp / "data") == ["b.txt"], CHANGE_TIMEOUT, "data relisted")
        wait_until(lambda: listdir(mp / "more") == ["m.txt"], CHANGE_TIMEOUT, "more listed")
        assert kept_open.read() == b"a"                    # open files keep working

    # a broken file: refused with its line and column, the mount keeps its views
    good = views_file.read_text()
    views_file.write_text(good + "  layout: sideways\n")
    r = mounts.run("reload", str(mp))
    assert r.returncode == 1
    assert f"{views_file}:" in r.stderr and "sideways" in r.stderr and "keeps its views" in r.stderr
    line_col = r.stderr.split(f"{views_file}:", 1)[1].split(":")[:2]
    assert all(part.isdigit() for part in line_col), r.stderr
    assert listdir(mp) == ["data", "more"]

    # SIGHUP does the same
    views_file.write_text(good + textwrap.dedent(f"""
    all:
      bucket: {bucket}
      object: "*"
      layout: flat
      ttl: 1s
    """))
    os.kill(mounts.daemon_pid(mp), signal.SIGHUP)
    wait_until(lambda: listdir(mp) == ["all", "data", "more"], CHANGE_TIMEOUT, "SIGHUP reloaded")
    wait_until(lambda: listdir(mp / "all") == ["data%2Fa.txt", "data%2Fsub%2Fb.txt", "more%2Fm.txt"],
               CHANGE_TIMEOUT, "the new view listed")
    mounts.umount(mp)
