"""The shard map (delvefs/shared/shards.py): parsing, owners by rendezvous hashing, placements."""
from __future__ import annotations

import collections

import pytest

from delvefs.shared.shards import UNSHARDED, ShardMap, ShardMapError
from eventhandler.notify import owner_target

MAP = "a=http://h1:8731,a=http://h1b:8731/,b=http://h2:8731,c=http://h3:8731"


def test_a_url_list_is_one_shard_without_a_map():
    m = ShardMap.parse("http://h1:8731, http://h1b:8731/")
    assert not m.sharded and m.shards == {UNSHARDED: ["http://h1:8731", "http://h1b:8731"]}
    assert m.owner("anything") == UNSHARDED and m.text() == "http://h1:8731,http://h1b:8731"


def test_named_entries_are_shards_with_their_standbys_in_order():
    m = ShardMap.parse(MAP)
    assert m.sharded and list(m.shards) == ["a", "b", "c"]
    assert m.urls("a") == ["http://h1:8731", "http://h1b:8731"]
    assert ShardMap.parse(m.text()) == m and ShardMap.from_json(m.as_json()) == m
    assert ShardMap.parse(MAP.split(",")) == m  # repeated -o handler= options


def test_every_bucket_has_one_owner_and_all_shards_get_some():
    m = ShardMap.parse(MAP)
    owners = collections.Counter(m.owner(f"bucket-{i}") for i in range(3000))
    assert set(owners) == {"a", "b", "c"} and min(owners.values()) > 800
    assert all(m.owner(f"bucket-{i}") == ShardMap.parse(MAP).owner(f"bucket-{i}") for i in range(100))


def test_adding_a_shard_moves_only_the_buckets_it_wins():
    old = ShardMap.parse(MAP)
    new = ShardMap.parse(MAP + ",d=http://h4:8731")
    for i in range(2000):
        b = f"bucket-{i}"
        assert new.owner(b) in (old.owner(b), "d")


def test_placements_win_over_hashing():
    m = ShardMap.parse(MAP + ",@photos=c")
    assert m.owner("photos") == "c" and m.placements == {"photos": "c"}
    moved = ShardMap.parse(MAP).placed("photos", "b")
    assert moved.owner("photos") == "b" and "@photos=b" in moved.text()


@pytest.mark.parametrize("text", ["", "a=http://x,http://y", "a=http://x,@b=z", "@b", "http://x,@b=a"])
def test_malformed_maps_are_refused(text):
    with pytest.raises(ShardMapError):
        ShardMap.parse(text)


def test_notify_wires_a_bucket_to_its_owners_target():
    m = ShardMap.parse(MAP)
    targets = "a=arn:aws:sqs:r:1:qa,b=arn:aws:sqs:r:1:qb,c=arn:aws:sqs:r:1:qc"
    for b in ("one", "two", "three"):
        assert owner_target(b, targets, MAP) == f"arn:aws:sqs:r:1:q{m.owner(b)}"
    assert owner_target("one", "arn:minio:sqs::PRIMARY:amqp", MAP) == "arn:minio:sqs::PRIMARY:amqp"
