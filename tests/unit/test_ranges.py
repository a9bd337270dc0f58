"""RangeSet against a plain set of bytes, on random operations."""
import random

import pytest

from delvefs.client.mount.cache.ranges import RangeSet


def test_add_merges_touching_and_overlapping_ranges():
    r = RangeSet([(0, 10), (20, 30)])
    r.add(10, 20)
    assert list(r) == [(0, 30)]
    r.add(40, 50)
    r.add(35, 45)
    assert list(r) == [(0, 30), (35, 50)]


def test_remove_cuts_a_hole():
    r = RangeSet([(0, 100)])
    r.remove(10, 20)
    assert list(r) == [(0, 10), (20, 100)]
    assert r.missing(0, 100) == [(10, 20)]
    assert not r.covers(5, 15) and r.covers(20, 100) and r.intersects(5, 15)


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_match_a_set_of_bytes(seed):
    rng = random.Random(seed)
    r, model = RangeSet(), set()
    for _ in range(200):
        s = rng.randrange(0, 200)
        e = s + rng.randrange(0, 40)
        op = rng.choice(["add", "add", "remove", "truncate"])
        if op == "add":
            r.add(s, e)
            model |= set(range(s, e))
        elif op == "remove":
            r.remove(s, e)
            model -= set(range(s, e))
        else:
            r.truncate(s)
            model = {b for b in model if b < s}
        covered = set()
        for a, b in r:
            assert a < b
            covered |= set(range(a, b))
        assert covered == model
        starts = [a for a, _ in r]
        ends = [b for _, b in r]
        assert all(ends[i] < starts[i + 1] for i in range(len(starts) - 1))  # disjoint, apart
        qs = rng.randrange(0, 240)
        qe = qs + rng.randrange(0, 60)
        want = set(range(qs, qe)) - model
        got = set()
        for a, b in r.missing(qs, qe):
            got |= set(range(a, b))
        assert got == want
        assert r.covers(qs, qe) == (not want)
        assert r.intersects(qs, qe) == bool(set(range(qs, qe)) & model)
        assert r.total == len(model)
