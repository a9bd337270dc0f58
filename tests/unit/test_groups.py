"""A work-queue group's bookkeeping (eventhandler/groups.py) over a dict for LevelDB:
claims, leases, acknowledgements, failures set aside, leaving, and what a restart keeps."""
from __future__ import annotations

from eventhandler import records as r
from eventhandler.groups import Groups, WorkGroup

VID = "0123456789abcdef"


class DictStore:
    """The few Store methods groups use, over a dict of LevelDB keys."""

    def __init__(self):
        self.data: dict[bytes, bytes] = {}

    def batch(self):
        store = self

        class Batch:
            def __init__(self):
                self.ops = []

            def put(self, k, v):
                self.ops.append((k, v))

            def delete(self, k):
                self.ops.append((k, None))

            def write(self):
                for k, v in self.ops:
                    if v is None:
                        store.data.pop(k, None)
                    else:
                        store.data[k] = v
        return Batch()

    @staticmethod
    def write(batch):
        batch.write()

    def load_groups(self):
        return [r.unpackb(v) for k, v in sorted(self.data.items()) if k.startswith(r.GROUP_PREFIX)]

    def iter_work(self, vid, name):
        prefix = r.work_prefix(vid, name)
        return [(k[len(prefix):].decode(), r.unpackb(v)) for k, v in sorted(self.data.items())
                if k.startswith(prefix)]

    def get_work(self, vid, name, key):
        raw = self.data.get(r.k_work(vid, name, key))
        return None if raw is None else r.unpackb(raw)


def news(g: WorkGroup, *files, version=10):
    """``files``: (key, op) pairs, as read_news answers them for group ``g``."""
    return {"kind": "changes", "version": version, "more": False,
            "files": [(key, op, version, None, op == "put" and g.store.get_work(g.vid, g.name, key) is not None)
                      for key, op in files]}


def make_group(lease=10.0, max_failures=2) -> tuple[Groups, WorkGroup, DictStore]:
    store = DictStore()
    groups = Groups(store)
    return groups, groups.create(VID, "g", lease, max_failures, cursor=0), store


def test_each_file_goes_to_one_member():
    _groups, g, _store = make_group()
    g.feed(news(g, ("a", "put"), ("b", "put"), ("c", "put")))
    first = g.claim("m1", 2, now=100.0)
    second = g.claim("m2", 2, now=100.0)
    assert [f["key"] for f in first] == ["a", "b"] and [f["key"] for f in second] == ["c"]
    assert g.claim("m3", 5, now=100.0) == []
    assert g.finish("m1", "a", True, None) == r.DONE
    g.feed(news(g, ("a", "put"), version=11))  # an update of a done file is no new work
    assert g.claim("m3", 5, now=100.0) == []
    report = g.report(101.0)
    assert (report["done"], report["in_flight"], report["backlog"], report["failed"]) == (1, 2, 0, 0)


def test_a_lapsed_lease_gives_the_file_to_another_and_counts_as_a_failure():
    _groups, g, _store = make_group(lease=10.0, max_failures=2)
    g.feed(news(g, ("a", "put")))
    assert g.claim("m1", 1, now=100.0)[0]["attempt"] == 1
    assert g.renew("m1", now=105.0) == ["a"]          # held to 115 now
    assert g.claim("m2", 1, now=114.0) == []
    again = g.claim("m2", 1, now=115.5)
    assert again[0]["key"] == "a" and again[0]["attempt"] == 2
    assert g.renew("m1", now=116.0) == []             # m1 lost it
    assert g.finish("m2", "a", False, "exit status 1") == r.FAILED  # 2 of 2 attempts
    report = g.report(117.0)
    assert report["failed_files"] == [{"key": "a", "attempts": 2, "error": "exit status 1"}]
    assert g.claim("m3", 1, now=118.0) == []          # set aside for good


def test_a_late_acknowledgement_still_counts_and_a_failure_only_from_the_holder():
    _groups, g, _store = make_group(lease=10.0, max_failures=3)
    g.feed(news(g, ("a", "put")))
    g.claim("m1", 1, now=100.0)
    g.claim("m2", 1, now=111.0)                       # m1's lease ran out: m2 holds it
    assert g.finish("m1", "a", False, "late") == r.IN_FLIGHT  # not m1's to fail
    assert g.finish("m1", "a", True, None) == r.DONE  # m1 finished after all
    assert g.finish("m2", "a", True, None) == r.DONE
    assert g.report(112.0)["done"] == 1


def test_a_member_that_leaves_gives_its_files_back_without_counting_an_attempt():
    _groups, g, _store = make_group(max_failures=1)
    g.feed(news(g, ("a", "put"), ("b", "put")))
    g.claim("m1", 2, now=100.0)
    assert g.release("m1") == 2
    taken = g.claim("m2", 2, now=101.0)
    assert sorted(f["key"] for f in taken) == ["a", "b"] and {f["attempt"] for f in taken} == {1}


def test_a_file_removed_from_the_view_leaves_the_group_and_may_come_back():
    _groups, g, _store = make_group()
    g.feed(news(g, ("a", "put"), ("b", "put")))
    g.claim("m1", 1, now=100.0)                       # a in flight
    g.finish("m1", "a", True, None)
    g.feed(news(g, ("a", "delete"), ("b", "delete"), version=11))
    assert g.report(101.0)["backlog"] == 0
    g.feed(news(g, ("a", "put"), version=12))            # gone and back: new work
    assert [f["key"] for f in g.claim("m1", 5, now=102.0)] == ["a"]


def test_a_restart_keeps_every_state_and_gives_files_in_flight_a_lease_more():
    groups, g, store = make_group(lease=10.0)
    g.feed(news(g, ("a", "put"), ("b", "put"), ("c", "put"), ("d", "put")))
    g.claim("m1", 2, now=100.0)                       # a, b in flight until 110
    g.finish("m1", "a", True, None)
    reloaded = Groups(store).get(VID, "g")
    assert reloaded.cursor == 10 and reloaded.done == 1
    held = reloaded.items["b"]
    assert held.state == r.IN_FLIGHT and held.member == "m1" and held.until > 110.0
    assert [f["key"] for f in reloaded.claim("m2", 5, now=111.0)] == ["c", "d"]
    assert reloaded.renew("m1", now=111.0) == ["b"]
