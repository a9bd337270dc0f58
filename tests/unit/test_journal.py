"""The journal's records: written whole, read back, the unusable ones dropped."""
from __future__ import annotations

import errno
import os

import pytest
import trio

from delvefs.client.mount.cache import journal as journal_module
from delvefs.client.mount.cache.journal import Journal
from delvefs.client.mount.errors import StoreError


def record(name: str, key: str = "k") -> dict:
    return {"file": name, "bucket": "b", "key": key, "base": ""}


def test_a_first_record_is_one_file_and_a_second_write_replaces_it_whole(tmp_path):
    j = Journal(tmp_path / "journal", tmp_path / "data")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f1").write_bytes(b"x")
    j.write(record("f1"))
    j.write(record("f1", key="renamed"))
    assert [r["key"] for r in j.read()] == ["renamed"]
    assert sorted(p.name for p in (tmp_path / "journal").iterdir()) == ["f1.json"]


def test_an_empty_record_left_by_a_mount_killed_while_creating_it_is_dropped(tmp_path):
    # created, killed before its one write: nothing of its file had been accepted yet
    j = Journal(tmp_path / "journal", tmp_path / "data")
    (tmp_path / "data").mkdir()
    for name in ("f1", "f2"):
        (tmp_path / "data" / name).write_bytes(b"x")
    j.write(record("f1"))
    (tmp_path / "journal" / "f2.json").write_bytes(b"")
    (tmp_path / "journal" / "f3.json.7.tmp").write_bytes(b"{")
    assert [r["file"] for r in j.read()] == ["f1"]
    assert sorted(p.name for p in (tmp_path / "journal").iterdir()) == ["f1.json"]


def test_a_read_leaves_this_processs_tmp_files_alone(tmp_path):
    # a background read (publishes left at start) while a rename writes its record: the
    # record's tmp file must survive until it is renamed into place
    from delvefs.client.mount.cache.journal import PublishJournal, _TMP_TAG
    j = PublishJournal(tmp_path / "publish")
    mine = tmp_path / "publish" / f"batch1{_TMP_TAG}tmp"
    mine.write_text("{}")
    (tmp_path / "publish" / "batch2.p1.tmp").write_text("{}")   # a dead mount's
    assert j.read() == []
    assert sorted(p.name for p in (tmp_path / "publish").iterdir()) == [mine.name]


def test_a_key_of_bytes_that_are_no_utf8_is_recorded_and_read_back(tmp_path):
    # a file name the kernel gave as bytes that are no UTF-8 (os.fsdecode: surrogates)
    j = Journal(tmp_path / "journal", tmp_path / "data")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f1").write_bytes(b"x")
    key = "dir/" + os.fsdecode(b"bad\xff")
    j.write(record("f1", key=key))
    assert [r["key"] for r in j.read()] == [key]


def test_a_record_to_be_removed_whose_rewrite_fails_is_still_removed(tmp_path, monkeypatch):
    j = Journal(tmp_path / "journal", tmp_path / "data")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f1").write_bytes(b"x")
    j.write(record("f1"))
    j._doomed_kick = trio.Event()   # as while ``run_removals`` runs: removals are batched
    j.remove(record("f1"))

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(journal_module, "_write_all", full)
    with pytest.raises(StoreError):
        j.write(record("f1", key="rewritten"))   # the old record stays on disk: still doomed
    j.remove_doomed()
    assert os.listdir(tmp_path / "journal") == []


def test_a_removal_at_once_does_not_wait_for_the_batch(tmp_path):
    j = Journal(tmp_path / "journal", tmp_path / "data")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f1").write_bytes(b"x")
    j.write(record("f1"))
    j._doomed_kick = trio.Event()
    j.remove(record("f1"), at_once=True)
    assert os.listdir(tmp_path / "journal") == []
