"""The shard map (delvefs/shared/shards.py): parsing, owners by rendezvous hashing (pinned by
fixed vectors), placements; ``delvefs shards owner``; the view xattr's serving shard."""
from __future__ import annotations

import collections
import json
import types
from pathlib import Path

import pytest

from delvefs.client.commands import viewdir
from delvefs.client.mount.fs.xattrs import Xattrs
from delvefs.client.handler.api import SyncHandlerClient
from delvefs.client.commands.shardctl import owner_of, owners
from delvefs.devtools.localservices import free_port
from delvefs.shared import shards as shards_module
from delvefs.shared.shards import UNSHARDED, ShardMap, ShardMapError, shard_score
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


# ------------------------------------------------ the owner of a bucket, exactly (pinned)

# score(S, B) = BLAKE2b with an 8-byte output of UTF-8(S) + b"\n" + UTF-8(B), big-endian;
# as `printf 'a\nphotos' | b2sum -l 64` prints it (docs/ARCHITECTURE.md, "Shards")
SCORES = [("a", "photos", 0x340D71F2A116338F), ("b", "photos", 0x5761DAECA484F2BB),
          ("c", "photos", 0x6FB8E5C567BC71C8), ("a", "genomes", 0x1DA42732DA8B9511),
          ("b", "genomes", 0xF4743398A8E0A8C1), ("c", "genomes", 0x8B6BFEF9D13867CE)]
OWNERS = {"photos": "c", "genomes": "b", "reads": "c", "runs-2024": "a", "t-0": "c", "x": "b"}


@pytest.mark.parametrize("shard,bucket,score", SCORES)
def test_the_rendezvous_score_is_blake2b_of_8_bytes_read_big_endian(shard, bucket, score):
    assert shard_score(shard, bucket) == score


def test_fixed_buckets_have_fixed_owners():
    m = ShardMap.parse(MAP)
    assert {b: m.owner(b) for b in OWNERS} == OWNERS
    # the order of the shards in the map does not matter, nor their URLs
    assert all(ShardMap.parse("c=http://x:1,b=http://y:1,a=http://z:1").owner(b) == o for b, o in OWNERS.items())


def test_equal_scores_go_to_the_greater_shard_name(monkeypatch):
    monkeypatch.setattr(shards_module, "shard_score", lambda shard, bucket: 7)
    assert ShardMap.parse("B=http://h1:1,a=http://h2:1,A-2=http://h3:1").owner("photos") == "a"


def test_one_shard_owns_everything_and_a_placement_wins_over_the_hash():
    assert ShardMap.parse("solo=http://h:1").owner("photos") == "solo"
    assert ShardMap.parse(MAP + ",@genomes=a").owner("genomes") == "a"


# ------------------------------------------------ delvefs shards owner

def test_the_owner_is_the_maps_unless_the_shards_report_a_handoff():
    m = ShardMap.parse(MAP + ",@genomes=a")
    assert owner_of("photos", m, {}) == {"bucket": "photos", "shard": "c", "urls": ["http://h3:8731"],
                                         "by": "hash"}
    assert owner_of("genomes", m, {})["by"] == "placement"
    moved = m.placed("photos", "b")  # every shard recorded the handoff
    found = owner_of("photos", m, {"a": moved, "b": moved, "c": "connection refused"})
    assert found == {"bucket": "photos", "shard": "b", "urls": ["http://h2:8731"], "by": "handoff"}
    # mid-move: b took the bucket, c (its old owner) not told yet: both claim it
    split = owner_of("photos", m, {"a": moved, "b": moved, "c": m})
    assert split["disagree"] == {"a": "b", "b": "b", "c": "c"}


def test_shards_owner_answers_for_any_bucket_without_a_shard_answering(capsys):
    # nothing listens on these ports: owners from the map alone, said on stderr
    ports = [free_port() for _ in range(3)]
    m = ShardMap.parse(",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip("abc", ports)) + ",@x=a")
    assert owners(m, ["photos", "genomes", "x"], "token") == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"photos: c (http://127.0.0.1:{ports[2]}; rendezvous hash)",
                                f"genomes: b (http://127.0.0.1:{ports[1]}; rendezvous hash)",
                                f"x: a (http://127.0.0.1:{ports[0]}; placed in the map)"]
    assert err.count("did not say its placements") == 3
    assert owners(m, ["photos"], "token", as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"bucket": "photos", "shard": "c", "urls": [f"http://127.0.0.1:{ports[2]}"], "by": "hash"}]
    assert owners(ShardMap.parse("http://h:1,http://h2:1"), ["photos"], None) == 0
    assert capsys.readouterr().out == "photos: the only handler (http://h:1, http://h2:1)\n"


# ------------------------------------------------ user.delvefs.view names the serving shard

def test_the_view_xattr_names_the_serving_shards_url_and_the_whole_map(monkeypatch):
    with SyncHandlerClient(MAP, "token") as client:
        xattrs = Xattrs(None, None, None, None, None, client)
        listing = types.SimpleNamespace(id="0123456789abcdef", version=3)
        view = types.SimpleNamespace(name="v", bucket="genomes", root="", by=None, flat=False,
                                     listing=listing)
        info = xattrs.view_info(view)
        assert (info["handler"], info["shard"], info["handlers"]) == ("http://h2:8731", "b", client.base_url)
        view.bucket = "reads"  # shard c; after a failover to a's standby, a's view says so
        assert xattrs.view_info(view)["handler"] == "http://h3:8731"
        client.failovers["a"].current = 1
        view.bucket = "runs-2024"
        assert xattrs.view_info(view)["handler"] == "http://h1b:8731"
        # delvefs watch follows the view with the whole map
        monkeypatch.setattr(viewdir.os, "getxattr", lambda path, name: json.dumps(info).encode())
        assert viewdir.ViewInfo.of(Path("/m/v")).handler == client.base_url
    with SyncHandlerClient("http://h:1,http://h2:1", "token") as client:
        info = Xattrs(None, None, None, None, None, client).view_info(view)
        assert (info["handler"], info["shard"], info["handlers"]) == ("http://h:1", None, "http://h:1,http://h2:1")
