"""Following a bucket that moves to another shard: the handler's record of the views it let
go (eventhandler/sharding.py), the change stream's ``moved`` event and the client that
follows it (delvefs/client/handler/endpoints.py, api.py), and how ``delvefs watch``
asks the mount to register a view the new owner does not know (delvefs/client/commands/viewdir.py)."""
from __future__ import annotations

import json

import httpx
import pytest

from delvefs.client.commands import viewdir
from delvefs.client.handler.api import HandlerError, Misdirected, SyncHandlerClient
from delvefs.client.handler.endpoints import stream_changes
from delvefs.shared.shards import ShardMap
from eventhandler.sharding import HANDOFFS_FILE, Sharding

MAP = "a=http://a.test,b=http://b.test"


def a_bucket_of(shard: str) -> str:
    m = ShardMap.parse(MAP)
    return next(b for b in (f"bucket-{i}" for i in range(100)) if m.owner(b) == shard)


# ---------------------------------------------------------------- the handler's side

def test_views_let_go_with_their_bucket_are_answered_as_moved_across_restarts(tmp_path):
    bucket = a_bucket_of("a")
    shard = Sharding("a", ShardMap.parse(MAP), tmp_path)
    shard.hand_off(bucket, "b")
    shard.release_views({"0123456789abcdef": (bucket, "data/")})
    assert shard.moved_view("0123456789abcdef") == (bucket, "data/")
    assert shard.moved_view("fedcba9876543210") is None  # never here: unknown, not moved
    again = Sharding("a", ShardMap.parse(MAP), tmp_path)  # a restart (or the standby)
    assert again.owner(bucket) == "b" and again.moved_view("0123456789abcdef") == (bucket, "data/")
    again.hand_off(bucket, "a")  # handed back: its views are this shard's again (404 until registered)
    assert again.moved_view("0123456789abcdef") is None and again.released == {}


def test_a_handoffs_file_of_buckets_only_is_read(tmp_path):
    bucket = a_bucket_of("a")
    (tmp_path / HANDOFFS_FILE).write_text(json.dumps({bucket: "b"}))
    shard = Sharding("a", ShardMap.parse(MAP), tmp_path)
    assert shard.owner(bucket) == "b" and shard.released == {}


# ---------------------------------------------------------------- the stream

def sse(*events: str) -> bytes:
    return "".join(events).encode()


def change(v: int, key: str) -> str:
    return f"id: {v}\ndata: {json.dumps({'v': v, 'op': 'put', 'key': key})}\n\n"


def moved(bucket: str, to: str) -> str:
    m = ShardMap.parse(MAP).placed(bucket, to)
    body = {"error": "misdirected", "bucket": bucket, "owner": to, "urls": m.urls(to), **m.as_json()}
    return f"event: moved\ndata: {json.dumps(body)}\n\n"


def test_the_moved_event_is_a_misdirected_error_with_the_new_map():
    bucket = a_bucket_of("a")
    changes = stream_changes(sse(change(5, "k1"), moved(bucket, "b")).decode().split("\n"))
    assert next(changes)["key"] == "k1"
    with pytest.raises(Misdirected) as exc:
        next(changes)
    assert exc.value.status == 421 and exc.value.body["owner"] == "b"
    assert ShardMap.from_json(exc.value.body).owner(bucket) == "b"


class FakeShards(SyncHandlerClient):
    """A client whose shards answer with ``answer(request) -> httpx.Response``."""

    def __init__(self, answer):
        self.answer = answer
        self.requests: list[httpx.Request] = []
        super().__init__(MAP, None)

    def _new_client(self, options: dict) -> httpx.Client:
        def recorded(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            return self.answer(request)
        return httpx.Client(**options, transport=httpx.MockTransport(recorded))


def stream(body: bytes) -> httpx.Response:
    return httpx.Response(200, content=body, headers={"Content-Type": "text/event-stream"})


def test_a_stream_ended_by_a_move_is_opened_again_at_the_new_owner_after_its_last_version():
    bucket = a_bucket_of("a")

    def answer(request):
        if request.url.host == "a.test":
            return stream(sse(change(5, "k1"), change(6, "k2"), moved(bucket, "b")))
        return stream(sse(change(9_000_000, "k3")))
    client = FakeShards(answer)
    client.know_view("0123456789abcdef", bucket)
    keys = [c["key"] for c in client.follow("0123456789abcdef", 4)]
    assert keys == ["k1", "k2", "k3"]
    assert [(r.url.host, r.headers["Last-Event-ID"]) for r in client.requests] == [("a.test", "4"), ("b.test", "6")]
    assert client.shards.owner(bucket) == "b"


def test_a_stream_answered_421_at_its_start_follows_the_map_it_names():
    bucket = a_bucket_of("a")
    m = ShardMap.parse(MAP).placed(bucket, "b")

    def answer(request):
        if request.url.host == "a.test":
            return httpx.Response(421, json={"error": "misdirected", "owner": "b", **m.as_json()})
        return stream(sse(change(7, "k")))
    client = FakeShards(answer)
    client.know_view("0123456789abcdef", bucket)
    assert [c["key"] for c in client.follow("0123456789abcdef", 1)] == ["k"]
    assert client.shards == m


def test_a_421_naming_the_map_the_client_has_is_an_error():
    bucket = a_bucket_of("a")
    m = ShardMap.parse(MAP)
    client = FakeShards(lambda request: httpx.Response(421, json={"error": "misdirected", **m.as_json()}))
    client.know_view("0123456789abcdef", bucket)
    with pytest.raises(HandlerError) as exc:
        list(client.follow("0123456789abcdef", 1))
    assert exc.value.status == 421


# ---------------------------------------------------------------- watch and group members

@pytest.fixture
def follower(tmp_path, monkeypatch):
    info = viewdir.ViewInfo("0123456789abcdef", "v", MAP, "data/", "tree", None, "b")
    monkeypatch.setattr(viewdir.ViewInfo, "of", classmethod(lambda cls, path: info))
    pokes: list[object] = []  # what each refresh the mount was asked for gave: None or an error
    outcomes: list[OSError | None] = []

    def refresh(view_dir):
        outcome = outcomes.pop(0) if outcomes else None
        pokes.append(outcome)
        return outcome
    monkeypatch.setattr(viewdir, "refresh_view", refresh)
    f = viewdir.ViewFollower(tmp_path)
    f.pokes, f.outcomes = pokes, outcomes
    return f


def not_found() -> HandlerError:
    return HandlerError("no view", 404, "not_found")


def test_an_unknown_view_is_registered_again_by_the_mount_until_it_refreshed_it(follower):
    follower.outcomes.extend([OSError(11, "scanning"), None])
    assert follower.register_again(not_found())      # the mount could not refresh it yet
    assert follower.register_again(not_found())      # now it did
    assert not follower.register_again(not_found())  # and the handler still does not know it: refused
    assert len(follower.pokes) == 2
    follower.view_answered()                         # the view answered meanwhile: a later 404 is asked again
    assert follower.register_again(not_found())


def test_until_answered_asks_again_after_the_mount_registered_the_view(follower):
    answers = [not_found(), not_found(), {"ok": True}]

    def request():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    follower.outcomes.extend([OSError(11, "scanning"), None])
    assert follower.until_answered(request, "view v") == {"ok": True}
    assert len(follower.pokes) == 2 and follower.pokes[1] is None and not follower.mount_refreshed


def test_until_answered_gives_up_on_a_view_the_handler_refuses(follower):
    def request():
        raise not_found()
    with pytest.raises(viewdir.WatchError, match="handler refused view v"):
        follower.until_answered(request, "view v")
    assert follower.pokes == [None]
