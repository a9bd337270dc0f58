"""Giving a claimed file back unworked (eventhandler/groups.py, ``WorkGroup.give_back``; the
API's ``done`` with ``give_back``): a member whose mount cannot show the file returns it
without an attempt counted; a file that left the view meanwhile leaves the group."""
from __future__ import annotations

from eventhandler import records as r
from eventhandler.groups import Groups

from .test_groups import make_group, news


def test_a_file_given_back_is_first_in_line_again_and_its_attempt_is_not_counted():
    _groups, g, store = make_group(max_failures=1)
    g.feed(news(g, ("a", "put"), ("b", "put")))
    assert [f["key"] for f in g.claim("m1", 1, now=100.0)] == ["a"]
    assert g.give_back("m1", "a", in_view=True) == r.PENDING
    (again,) = g.claim("m2", 1, now=101.0)
    assert (again["key"], again["attempt"]) == ("a", 1)  # first in line, still the first attempt
    assert g.finish("m2", "a", True, None) == r.DONE
    report = g.report(102.0)
    assert (report["done"], report["failed"], report["backlog"]) == (1, 0, 1)
    # kept in LevelDB as it is: a restart sees no attempt either
    g.claim("m1", 1, now=103.0)
    g.give_back("m1", "b", in_view=True)
    reloaded = Groups(store).get(g.vid, g.name)
    assert reloaded.items["b"].state == r.PENDING and reloaded.items["b"].attempts == 0


def test_only_the_holder_gives_a_file_back():
    _groups, g, _store = make_group()
    g.feed(news(g, ("a", "put")))
    g.claim("m1", 1, now=100.0)
    assert g.give_back("m2", "a", in_view=True) == r.IN_FLIGHT
    assert g.items["a"].member == "m1" and g.items["a"].attempts == 1
    assert g.give_back("m1", "nothing", in_view=True) == "unknown"
    g.finish("m1", "a", True, None)
    assert g.give_back("m1", "a", in_view=True) == r.DONE  # done stays done


def test_a_file_that_left_the_view_leaves_the_group_when_given_back():
    _groups, g, store = make_group()
    g.feed(news(g, ("a", "put")))
    g.claim("m1", 1, now=100.0)
    g.feed(news(g, ("a", "delete"), version=11))  # in flight: stays in the group until its end
    assert "a" in g.items
    assert g.give_back("m1", "a", in_view=False) == "removed"
    assert "a" not in g.items and store.get_work(g.vid, g.name, "a") is None
    assert g.claim("m1", 1, now=101.0) == []
    g.feed(news(g, ("a", "put"), version=12))  # when it appears again, it is new work
    (new,) = g.claim("m1", 1, now=102.0)
    assert (new["key"], new["attempt"]) == ("a", 1)
