"""Three handler shards on one RabbitMQ and one MinIO: each bucket's events reach its owner
only (routed by the broker), clients find the owner themselves (and follow a 421 when
their map is outdated), a mount spans the shards, one shard's standby takes over a SIGKILL
while the others go on, a bucket handed to another shard keeps every object, and
``delvefs shards owner`` names any bucket's owner."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid

import pytest

from delvefs.client.handler.api import HandlerError, SyncHandlerClient
from delvefs.devtools.localservices import free_port
from delvefs.shared.s3 import ensure_bucket, presigned_list_url, wire_notifications
from delvefs.shared.shards import ShardMap
from eventhandler.devtools import HandlerGroup, spec

from ..conftest import service_unavailable
from ..waiting import wait_until
from .mounts import DELVEFS, Mounts, fuse_available, listdir
from .test_watch import WatchProcess

pytestmark = pytest.mark.services

SHARDS = ("a", "b", "c")
OBJECTS = 40  # per bucket
CATCH_UP = 90.0  # generous bound on MinIO -> RabbitMQ -> shard (a loaded machine)


class Deployment:
    """Three shards (``a`` with a standby), their map, one bucket owned by each."""

    def __init__(self, services, env: dict, s3, tmp_path, group: HandlerGroup):
        self.services, self.s3, self.tmp = services, s3, tmp_path
        ports = {name: free_port() for name in SHARDS}
        self.standby_port = free_port()
        entries = []
        for name in SHARDS:
            entries.append(f"{name}=http://127.0.0.1:{ports[name]}")
            if name == "a":
                entries.append(f"a=http://127.0.0.1:{self.standby_port}")
        self.map_text = ",".join(entries)
        self.map = ShardMap.parse(self.map_text)
        run = uuid.uuid4().hex[:8]
        self.queues = {name: f"shard-{run}-{name}" for name in SHARDS}
        self.group = group
        self.handlers = {name: self._start(name, ports[name]) for name in SHARDS}
        self.standby = self._start("a", self.standby_port, standby=True)
        self.buckets = {}  # shard -> a bucket it owns
        while len(self.buckets) < len(SHARDS):
            b = f"t-{uuid.uuid4().hex[:12]}"
            self.buckets.setdefault(self.map.owner(b), b)
        for b in self.buckets.values():
            ensure_bucket(s3, b)
            wire_notifications(s3, b, services.minio.notify_arn)
        self.client = SyncHandlerClient(self.map_text, "test-token", timeout=60)
        # a client's environment: the map, the token, the services
        self.env = {**os.environ, **services.env(), "DELVEFS_HANDLER_URL": self.map_text,
                    "DELVEFS_HANDLER_TOKEN": "test-token"}

    def _start(self, name: str, port: int, standby: bool = False):
        try:
            return self.group.start(self.tmp / f"shard-{name}", standby=standby, port=port,
                                    queue=self.queues[name],
                                    args=("--shard", name, "--shard-map", self.map_text))
        except RuntimeError as exc:
            service_unavailable(f"event handler shard {name}: {exc}")

    def register(self, client=None) -> dict[str, str]:
        """One view per bucket, registered through the routed client: bucket -> view id."""
        client = client or self.client
        views = [{"name": f"all-{b}", "spec": spec(b)} for b in self.buckets.values()]
        answer = client.register("shard-test", views, {b: presigned_list_url(self.s3, b)
                                                       for b in self.buckets.values()})
        return {v["spec"]["bucket"]: a["id"] for v, a in zip(views, answer)}

    def put(self, bucket: str, prefix: str, n: int = OBJECTS) -> set[str]:
        keys = {f"{prefix}/k{i:03d}" for i in range(n)}
        for k in sorted(keys):
            self.s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
        return keys

    def bucket_keys(self, bucket: str) -> set[str]:
        keys = set()
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys.update(o["Key"] for o in page.get("Contents", []))
        return keys

    def view_keys(self, vid: str, client=None) -> set[str]:
        return set((client or self.client).list_all(vid)[1])

    def shard_answer(self, name: str) -> dict:
        return self.handlers[name].api.shard_maps()


@pytest.fixture
def deployment(services, service_env, s3, tmp_path):
    group = HandlerGroup(service_env, services.rabbit.url)
    d = Deployment(services, service_env, s3, tmp_path, group)
    yield d
    d.client.close()
    group.close()


def test_each_buckets_events_reach_its_owner_only(deployment):
    d = deployment
    vids = d.register()
    written = {b: d.put(b, "x") for b in d.buckets.values()}
    for b, vid in vids.items():
        wait_until(lambda: d.view_keys(vid) == written[b], CATCH_UP, f"every object of {b} listed")
    for name, bucket in d.buckets.items():
        answer = d.shard_answer(name)
        assert answer["shard"] == name and answer["buckets"] == [bucket]
        assert answer["foreign_events"] == 0
        # every event reaches its owner (a first scan may have listed the objects before
        # their events came, so wait for the events themselves) ...
        wait_until(lambda: d.handlers[name].metric("delvefs_events_processed_total") >= OBJECTS,
                   CATCH_UP, f"shard {name} processed the events of {bucket}")
        # ... and nothing reached a shard that it had to drop: the broker routed by bucket
        assert d.handlers[name].metric("delvefs_events_dropped_total") == 0
        assert d.shard_answer(name)["foreign_events"] == 0
        # its metrics name the shard (dashboards join on it)
        assert f'delvefs_handler_info{{shard="{name}"}} 1.0' in d.handlers[name].api.metrics()


def test_a_shard_answers_421_and_an_outdated_client_follows_it(deployment):
    d = deployment
    vids = d.register()
    bucket_a = d.buckets["a"]
    # asked directly about a bucket it does not own, shard b names the owner and the map
    r = d.handlers["b"].http.get(f"/v1/objects/{bucket_a}/some-key")
    assert r.status_code == 421
    body = r.json()
    assert body["error"] == "misdirected" and body["owner"] == "a" and body["shard"] == "b"
    assert body["urls"] == d.map.urls("a") and ShardMap.from_json(body) == d.map
    # a client whose map has a's and b's URLs the wrong way round is corrected by the 421
    swapped = d.map_text.replace(f"a=http://127.0.0.1:{d.handlers['a'].port}", "TMP") \
        .replace(f"b=http://127.0.0.1:{d.handlers['b'].port}", f"b=http://127.0.0.1:{d.handlers['a'].port}") \
        .replace("TMP", f"a=http://127.0.0.1:{d.handlers['b'].port}")
    with SyncHandlerClient(swapped, "test-token", timeout=60) as outdated:
        assert outdated.shards != d.map
        outdated.register("outdated", [{"name": "all", "spec": spec(bucket_a)}],
                          {bucket_a: presigned_list_url(d.s3, bucket_a)})
        assert outdated.shards == d.map
        keys = d.put(bucket_a, "o", 5)
        wait_until(lambda: keys <= d.view_keys(vids[bucket_a], outdated), CATCH_UP, "listed via the owner")
    assert d.client.shard_maps()["c"]["shard"] == "c"
    shown = subprocess.run([DELVEFS, "shards", "show"], env=d.env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for name, bucket in d.buckets.items():
        assert f"{name}: " in shown.stdout and bucket in shown.stdout
    assert shown.stdout.count("foreign events: 0") == len(SHARDS)


def test_a_mount_spans_the_shards(deployment, tmp_path):
    if not fuse_available():
        service_unavailable("/dev/fuse or fusermount3 missing")
    d = deployment
    env = {**d.env, "DELVEFS_STATE_HOME": str(tmp_path / "state")}
    for b in d.buckets.values():
        d.put(b, "data", 3)
    m = Mounts(tmp_path, env)
    try:
        mp = m.mount("".join(f"""
            {name}:
              bucket: {b}
              object: "data/*"
              ttl: 1s
            """ for name, b in d.buckets.items()))
        for name, b in d.buckets.items():
            wait_until(lambda: {f"k{i:03d}" for i in range(3)} <= set(listdir(mp / name) or ()), CATCH_UP,
                       f"view {name} lists its bucket")
            # the view's directory names the shard serving it, and the whole map
            info = json.loads(os.getxattr(mp / name, "user.delvefs.view"))
            assert (info["shard"], info["handler"]) == (name, d.map.urls(name)[0])
            assert ShardMap.parse(info["handlers"]) == d.map
            (mp / name / "written.txt").write_text(f"into {b}")
        for name, b in d.buckets.items():  # close returned: S3 has it (close-to-open)
            assert d.s3.get_object(Bucket=b, Key="data/written.txt")["Body"].read() == f"into {b}".encode()
            wait_until(lambda: "written.txt" in listdir(mp / name), CATCH_UP, "the written file listed")
        vids = d.register()
        for b, vid in vids.items():  # the shards hold what the mount wrote
            wait_until(lambda: d.view_keys(vid) == d.bucket_keys(b), CATCH_UP, f"{b} as in S3")
    finally:
        m.cleanup()


def test_a_killed_shard_fails_over_while_the_others_go_on(deployment):
    d = deployment
    vids = d.register()
    others = [d.handlers[n] for n in ("b", "c")]
    failures: list[str] = []
    stop = threading.Event()

    def watch_others() -> None:  # the other shards answer throughout
        while not stop.is_set():
            for h in others:
                try:
                    if h.api.health(timeout=10)["status"] != "ok":
                        failures.append(f"{h.url} degraded")
                except HandlerError as exc:
                    failures.append(f"{h.url}: {exc}")
            stop.wait(0.05)
    watcher = threading.Thread(target=watch_others, daemon=True)
    watcher.start()
    try:
        first = {b: d.put(b, "before", OBJECTS // 2) for b in d.buckets.values()}
        d.handlers["a"].kill()
        wait_until(lambda: d.standby.role() == "active", 60, "a's standby took over")
        second = {b: d.put(b, "after", OBJECTS // 2) for b in d.buckets.values()}
        for b, vid in vids.items():
            wait_until(lambda: d.view_keys(vid) == first[b] | second[b] == d.bucket_keys(b), CATCH_UP,
                       f"view of {b} equals its bucket")
    finally:
        stop.set()
        watcher.join(30)
    assert failures == []


def move(d: Deployment, bucket: str, to: str) -> None:
    """``delvefs shards move BUCKET --to SHARD``, as an operator runs it."""
    r = subprocess.run([DELVEFS, "shards", "move", bucket, "--to", to], env=d.env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert f"@{bucket}={to}" in r.stdout


def test_a_bucket_moved_to_another_shard_keeps_every_object(deployment):
    d = deployment
    vids = d.register()
    bucket = d.buckets["a"]
    before = d.put(bucket, "before")
    wait_until(lambda: d.view_keys(vids[bucket]) == before, CATCH_UP, "listed on shard a")
    move(d, bucket, "c")
    during = d.put(bucket, "during")
    # shard a lets it go; a client with the old map follows the 421 to c, which does not
    # know the view until it is registered there
    assert bucket not in d.shard_answer("a")["buckets"]
    with pytest.raises(HandlerError) as gone:
        d.client.list_page(vids[bucket], None)
    assert gone.value.status == 404 and d.client.shards.owner(bucket) == "c"
    moved = d.register()
    assert moved[bucket] == vids[bucket]
    after = d.put(bucket, "after")
    wait_until(lambda: d.view_keys(vids[bucket]) == before | during | after == d.bucket_keys(bucket),
               CATCH_UP, "every object of the moved bucket listed on shard c")
    assert d.shard_answer("c")["buckets"] == sorted([bucket, d.buckets["c"]])
    assert all(d.shard_answer(n)["foreign_events"] == 0 for n in ("b", "c"))


def test_a_mount_a_watch_and_a_group_member_follow_a_moved_bucket(deployment, tmp_path):
    if not fuse_available():
        service_unavailable("/dev/fuse or fusermount3 missing")
    d = deployment
    bucket = d.buckets["a"]
    before = files(d, bucket, "before")
    m = Mounts(tmp_path, {**d.env, "DELVEFS_STATE_HOME": str(tmp_path / "state")})
    watch = member = None
    try:
        view_dir = m.mount(f"""
            moved:
              bucket: {bucket}
              object: "data/*"
              ttl: 1s
            """) / "moved"
        wait_until(lambda: set(listdir(view_dir) or ()) == names(before), CATCH_UP,
                   "the mount lists the bucket on shard a")
        watch = WatchProcess(view_dir, m.env)
        member = WatchProcess(view_dir, m.env, "--group", "g", ready="waiting for files")
        first = files(d, bucket, "first")
        watch.wait_lines(len(first), "watch prints the files written before the move")
        move(d, bucket, "c")
        # written while the mount, watch and member still know shard a: the new owner's
        # first scan finds them
        during = files(d, bucket, "during")
        # the member's long poll was answered 421; it joins the group anew on c
        wait_until(lambda: any("answers again" in line for line in member.log[1:]), CATCH_UP,
                   "the group member to join the group on shard c")
        after = files(d, bucket, "after")
        everything = before | first | during | after
        wait_until(lambda: set(listdir(view_dir) or ()) == names(everything), CATCH_UP,
                   "the mount lists every object of the moved bucket")
        printed = sorted(str(view_dir / n) for n in names(first | during | after))
        wait_until(lambda: sorted(watch.lines) == printed, CATCH_UP,
                   "watch prints every file written since it started, once")
        wait_until(lambda: {str(view_dir / n) for n in names(after)} <= set(member.lines), CATCH_UP,
                   "the group member gets the files written after it joined on shard c")
        assert len(member.lines) == len(set(member.lines))  # none twice
        assert bucket in d.shard_answer("c")["buckets"] and bucket not in d.shard_answer("a")["buckets"]
    finally:
        for p in (watch, member):
            if p is not None:
                p.stop()
        m.cleanup()


def files(d: Deployment, bucket: str, name: str, n: int = 5) -> set[str]:
    """``n`` new objects ``data/NAME-i`` (their keys)."""
    keys = {f"data/{name}-{i}" for i in range(n)}
    for k in sorted(keys):
        d.s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    return keys


def names(keys: set[str]) -> set[str]:
    """The names a view of "data/*" shows for ``keys``."""
    return {k.split("/", 1)[1] for k in keys}


def shards_owner(d: Deployment, *buckets: str) -> dict[str, dict]:
    """``delvefs shards owner BUCKET... --json``, as an operator runs it: bucket -> answer."""
    r = subprocess.run([DELVEFS, "shards", "owner", *buckets, "--json"], env=d.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {f["bucket"]: f for f in json.loads(r.stdout)}


def test_a_shard_names_the_owner_of_a_view_it_can_place_and_any_buckets_owner_is_found(deployment):
    d = deployment
    vids = d.register()
    bucket, vid = d.buckets["a"], vids[d.buckets["a"]]
    requests = [("GET", f"/v1/views/{vid}/objects"), ("GET", f"/v1/views/{vid}/changes?since=0"),
                ("DELETE", f"/v1/views/{vid}")]
    # shard b never had the view: its id (a hash of its spec) names no bucket, so 404
    for method, path in requests:
        r = d.handlers["b"].http.request(method, path)
        assert r.status_code == 404 and r.json()["error"] == "not_found", (method, path, r.text)
    # any bucket's owner, used or not
    unused = next(b for b in (f"never-used-{i}" for i in range(100)) if d.map.owner(b) == "b")
    found = shards_owner(d, bucket, unused)
    assert found[bucket] == {"bucket": bucket, "shard": "a", "urls": d.map.urls("a"), "by": "hash"}
    assert found[unused] == {"bucket": unused, "shard": "b", "urls": d.map.urls("b"), "by": "hash"}
    move(d, bucket, "c")
    # shard a forgot the view with its bucket, and names the owner: 421 for every request
    for method, path in requests:
        r = d.handlers["a"].http.request(method, path)
        assert r.status_code == 421, (method, path, r.text)
        assert r.json()["owner"] == "c" and r.json()["urls"] == d.map.urls("c")
    # the shards report the handoff; the map given to clients does not place it yet
    assert shards_owner(d, bucket)[bucket] == {"bucket": bucket, "shard": "c", "urls": d.map.urls("c"),
                                               "by": "handoff"}
    # a client with the old map follows the 421 to c, which knows no registration of it yet
    assert d.client.unregister(vid) is None and d.client.shards.owner(bucket) == "c"
