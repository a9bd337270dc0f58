"""The event handler against real MinIO, RabbitMQ and LevelDB: events move objects in and
out of views; replays and out-of-order events change nothing; poison messages are
dead-lettered; lazy scan; time-relative rules; API auth, paging, changes and resync."""
from __future__ import annotations

import time

import httpx
import pytest

from delvefs.shared.s3 import presigned_list_url
from eventhandler.devtools import HandlerProcess, Publisher, spec
from tests.waiting import wait_until

pytestmark = pytest.mark.services


@pytest.fixture
def handler(services, service_env, tmp_path):
    started = []

    def start(state_dir=None, **kw):
        h = HandlerProcess(service_env, state_dir or tmp_path / f"state{len(started)}", **kw)
        started.append(h)
        return h.start()

    yield start
    pub = Publisher(services.rabbit.url)
    for h in started:
        h.close()
        pub.delete_queue(h.queue)
    pub.close()


@pytest.fixture
def publisher(services):
    p = Publisher(services.rabbit.url)
    yield p
    p.close()


def register(h, s3, views, buckets=None):
    buckets = buckets or {v["bucket"] for v in views.values()}
    r = h.register(views, {b: presigned_list_url(s3, b) for b in buckets})
    assert r.status_code == 200, r.text
    return {v["name"]: v["id"] for v in r.json()["views"]}


def tag(s3, bucket, key, **tags):
    s3.put_object_tagging(Bucket=bucket, Key=key,
                          Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]})


def test_events_move_objects_in_and_out_of_views(handler, s3, bucket):
    s3.put_object(Bucket=bucket, Key="pre/existing.fastq", Body=b"x" * 10)  # before the scan
    s3.put_object(Bucket=bucket, Key="pre/tagged", Body=b"", Tagging="stage=raw")  # tags found by the scan
    h = handler()
    ids = register(h, s3, {"fastq": spec(bucket, object="*.fastq"),
                           "raw": spec(bucket, properties={"stage": ["raw"]}),
                           "big": spec(bucket, size=[5, None])})
    assert h.keys(ids["fastq"]) == {"pre/existing.fastq"}
    wait_until(lambda: h.keys(ids["raw"]) == {"pre/tagged"}, 10, "scan fetched tags")
    s3.put_object(Bucket=bucket, Key="a b+c.fastq", Body=b"hello")   # URL-encoded in the event
    s3.put_object(Bucket=bucket, Key="small.txt", Body=b"hi")
    wait_until(lambda: h.keys(ids["fastq"]) == {"pre/existing.fastq", "a b+c.fastq"}, 10, "create")
    assert h.keys(ids["big"]) == {"pre/existing.fastq", "a b+c.fastq"}
    assert h.keys(ids["raw"]) == {"pre/tagged"}
    s3.delete_object(Bucket=bucket, Key="pre/tagged")
    tag(s3, bucket, "small.txt", stage="raw")
    wait_until(lambda: h.keys(ids["raw"]) == {"small.txt"}, 10, "PutTagging moves it in")
    s3.delete_object_tagging(Bucket=bucket, Key="small.txt")
    wait_until(lambda: h.keys(ids["raw"]) == set(), 10, "DeleteTagging moves it out")
    s3.put_object(Bucket=bucket, Key="tagged-on-put.txt", Body=b"x", Tagging="stage=raw")
    wait_until(lambda: h.keys(ids["raw"]) == {"tagged-on-put.txt"}, 10, "tags given at PUT")
    s3.copy_object(Bucket=bucket, Key="copy.fastq", CopySource={"Bucket": bucket, "Key": "small.txt"})
    wait_until(lambda: "copy.fastq" in h.keys(ids["fastq"]), 10, "copy")
    s3.delete_object(Bucket=bucket, Key="a b+c.fastq")
    wait_until(lambda: h.keys(ids["fastq"]) == {"pre/existing.fastq", "copy.fastq"}, 10, "delete")
    # one key's lookup
    r = h.http.get(f"/v1/objects/{bucket}/tagged-on-put.txt")
    assert r.status_code == 200 and r.json()["tags"] == {"stage": "raw"}
    assert r.json()["views"] == [ids["raw"]]
    assert h.http.get(f"/v1/objects/{bucket}/a b+c.fastq").status_code == 404


def test_replayed_and_out_of_order_events_change_nothing(handler, s3, bucket, publisher):
    h = handler()
    ids = register(h, s3, {"all": spec(bucket)})
    base = time.time_ns()
    publisher.publish("s3:ObjectCreated:Put", bucket, "k", base + 2000, size=2, etag="v2")
    publisher.publish("s3:ObjectCreated:Put", bucket, "k", base + 1000, size=1, etag="v1")  # late
    publisher.publish("s3:ObjectCreated:Put", bucket, "gone", base + 1000, size=1, etag="g1")
    publisher.publish("s3:ObjectRemoved:Delete", bucket, "gone", base + 3000)
    publisher.publish("s3:ObjectCreated:Put", bucket, "gone", base + 1000, size=1, etag="g1")  # replay
    publisher.publish("s3:ObjectCreated:Put", bucket, "marker", base + 5000, size=5, etag="m")
    wait_until(lambda: "marker" in h.keys(ids["all"]), 10, "marker")
    version, objs = h.list_all(ids["all"])
    assert set(objs) == {"k", "marker"} and objs["k"]["etag"] == "v2" and objs["k"]["size"] == 2
    # replay everything again: nothing changes, not even the version
    publisher.publish("s3:ObjectCreated:Put", bucket, "k", base + 2000, size=2, etag="v2")
    publisher.publish("s3:ObjectRemoved:Delete", bucket, "gone", base + 3000)
    publisher.publish("s3:ObjectCreated:Put", bucket, "marker2", base + 6000, size=5, etag="m")
    wait_until(lambda: "marker2" in h.keys(ids["all"]), 10, "marker2")
    r = h.http.get(f"/v1/views/{ids['all']}/changes", params={"since": version}).json()
    assert [(c["op"], c["key"]) for c in r["changes"]] == [("put", "marker2")]


def test_poison_message_is_dead_lettered_and_next_event_applies(handler, s3, bucket, publisher):
    h = handler()
    ids = register(h, s3, {"all": spec(bucket)})
    publisher.raw(b"\x00not json", {"minio-bucket": bucket})
    publisher.raw(b'{"Records": [{"eventName": "s3:ObjectCreated:Put"}]}', {"minio-bucket": bucket})
    publisher.raw(b'{"Records": "nope"}')
    publisher.publish("s3:ObjectCreated:Put", bucket, "after-poison", time.time_ns(), size=1, etag="e")
    wait_until(lambda: h.keys(ids["all"]) == {"after-poison"}, 10, "event after poison")
    wait_until(lambda: h.metric("delvefs_events_dead_lettered_total") == 3, 5, "dead-letter count")
    dead = f"{h.queue}.dead"
    assert publisher.queue_count(dead) == 3
    assert publisher.queue_count(h.queue) == 0  # no redelivery loop
    assert h.proc.poll() is None


def test_auth_and_proof(handler, s3, bucket):
    h = handler()
    r = httpx.post(h.url + "/v1/views", json={"views": []})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    r = httpx.get(h.url + "/v1/views/0000000000000000/objects", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert httpx.get(h.url + "/healthz").status_code == 200  # no token needed
    assert "delvefs_events_processed_total" in httpx.get(h.url + "/metrics").text
    views = {"v": spec(bucket)}
    r = h.register(views, {})
    assert r.status_code == 403 and bucket in r.json()["message"]
    # a presigned URL with wrong credentials: the store says 403, so do we
    from delvefs.shared.config import S3Settings
    from delvefs.shared.s3 import make_client
    settings = S3Settings.from_env()
    bad = make_client(S3Settings(settings.endpoint_url, settings.access_key, "wrong-secret", settings.region))
    r = h.register(views, {bucket: presigned_list_url(bad, bucket)})
    assert r.status_code == 403
    # a URL pointing elsewhere than the object store is refused without being fetched
    r = h.register(views, {bucket: f"http://127.0.0.1:1/{bucket}?list-type=2&X-Amz-Signature=x"})
    assert r.status_code == 403
    # invalid spec
    r = h.register({"v": {"bucket": bucket, "size": "nonsense"}}, {bucket: presigned_list_url(s3, bucket)})
    assert r.status_code == 400
    ids = register(h, s3, views)
    ids2 = register(h, s3, {"other-name": spec(bucket)})
    assert ids["v"] == ids2["other-name"]  # identical specs share one id
    assert h.http.get("/v1/views/ffffffffffffffff/objects").status_code == 404


def test_paging_changes_and_resync(handler, s3, bucket):
    for i in range(25):
        s3.put_object(Bucket=bucket, Key=f"k{i:03d}", Body=b"x")
    h = handler()
    vid = register(h, s3, {"all": spec(bucket)})["all"]
    listed = list(h.pages(vid, limit=10))
    pages = [[o["key"] for o in page["objects"]] for page in listed]
    assert [len(p) for p in pages] == [10, 10, 5]
    assert sum(pages, []) == [f"k{i:03d}" for i in range(25)]  # stable byte order
    version = listed[-1]["version"]
    # long poll: returns as soon as a change exists
    s3.put_object(Bucket=bucket, Key="new", Body=b"x")
    r = h.http.get(f"/v1/views/{vid}/changes", params={"since": version, "wait": 10}).json()
    assert [(c["op"], c["key"]) for c in r["changes"]] == [("put", "new")]
    assert r["changes"][0]["object"]["size"] == 1
    v2 = r["version"]
    s3.delete_object(Bucket=bucket, Key="k000")
    r = h.http.get(f"/v1/views/{vid}/changes", params={"since": v2, "wait": 10}).json()
    assert [(c["op"], c["key"], c["object"]) for c in r["changes"]] == [("delete", "k000", None)]
    # an empty long poll times out with no changes
    t0 = time.monotonic()
    r = h.http.get(f"/v1/views/{vid}/changes", params={"since": r["version"], "wait": 0.3}).json()
    assert r["changes"] == [] and time.monotonic() - t0 >= 0.25
    # versions from before the view existed, or from the future: resync
    for since in (0, r["version"] + 1000):
        resp = h.http.get(f"/v1/views/{vid}/changes", params={"since": since})
        assert resp.status_code == 410 and resp.json()["error"] == "resync"
        assert resp.json()["version"] == r["version"]
    # msgpack listing
    import msgpack
    resp = h.http.get(f"/v1/views/{vid}/objects", headers={"Accept": "application/msgpack"})
    assert resp.headers["content-type"].startswith("application/msgpack")
    assert len(msgpack.unpackb(resp.content)["objects"]) == 25


def test_relative_modified_rule_flips_without_events(handler, s3, bucket):
    h = handler()
    ids = register(h, s3, {"fresh": spec(bucket, modified={"kind": "age", "lo": None, "hi": 2.0,
                                                           "lo_open": False, "hi_open": True}),
                           "old": spec(bucket, modified={"kind": "age", "lo": 2.0, "hi": None,
                                                         "lo_open": False, "hi_open": False})})
    s3.put_object(Bucket=bucket, Key="f", Body=b"x")
    wait_until(lambda: h.keys(ids["fresh"]) == {"f"}, 10, "fresh")
    assert h.keys(ids["old"]) == set()
    _, version = None, h.list_all(ids["fresh"])[0]
    wait_until(lambda: h.keys(ids["fresh"]) == set() and h.keys(ids["old"]) == {"f"}, 10, "aged out")
    r = h.http.get(f"/v1/views/{ids['fresh']}/changes", params={"since": version}).json()
    assert [(c["op"], c["key"]) for c in r["changes"]] == [("delete", "f")]


def test_stream_sends_changes_and_resumes(handler, s3, bucket):
    h = handler()
    vid = register(h, s3, {"all": spec(bucket)})["all"]
    version = h.list_all(vid)[0]
    s3.put_object(Bucket=bucket, Key="s1", Body=b"x")
    # Keepalives every 15 s keep a read timeout from firing: bound the wait ourselves.
    deadline = time.monotonic() + 60
    got = []
    with h.http.stream("GET", f"/v1/views/{vid}/stream", params={"since": version}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            assert time.monotonic() < deadline, f"no change on the stream after 60 s: {got}"
            if line.startswith("id: "):
                got.append(int(line[4:]))
            if line.startswith("data: "):
                got.append(line)
                break
    assert '"key":"s1"' in got[-1]
    with h.http.stream("GET", f"/v1/views/{vid}/stream", params={"since": 1}) as resp:
        lines = []
        for line in resp.iter_lines():
            assert time.monotonic() < deadline, f"no resync on the stream: {lines}"
            lines.append(line)
            if line.startswith("data"):
                break
    assert lines[0] == "event: resync"


def test_new_view_on_tracked_bucket_is_built_from_stored_objects(handler, s3, bucket):
    h = handler()
    ids = register(h, s3, {"all": spec(bucket)})
    s3.put_object(Bucket=bucket, Key="red.txt", Body=b"x", Metadata={"Color": "red"})
    s3.put_object(Bucket=bucket, Key="blue.txt", Body=b"x", Metadata={"Color": "blue"})
    s3.put_object(Bucket=bucket, Key="tagged.txt", Body=b"x", Tagging="color=red")
    wait_until(lambda: len(h.keys(ids["all"])) == 3, 10, "objects known")
    # a second client, a view with property rules (metadata or tags) on the same bucket
    ids2 = register(h, s3, {"red": spec(bucket, properties={"color": ["red"]})})
    assert h.keys(ids2["red"]) == {"red.txt", "tagged.txt"}
    r = h.http.get(f"/v1/objects/{bucket}/red.txt").json()
    assert r["metadata"] == {"color": "red"} and sorted(r["views"]) == sorted([ids["all"], ids2["red"]])


def test_views_are_unregistered_forgotten_when_unused_and_logged(handler, s3, bucket):
    """DELETE drops a registration (the last one forgets the view); a view no mount uses
    for --view-ttl is forgotten; both are in the registration log; a forgotten view is
    registered again like a new one, with its objects."""
    h = handler(args=("--view-ttl", "1.5"))
    ids = register(h, s3, {"used": spec(bucket, object="u/*"), "dropped": spec(bucket, object="d/*"),
                           "idle": spec(bucket, object="i/*")})
    s3.put_object(Bucket=bucket, Key="u/1", Body=b"x")
    wait_until(lambda: h.keys(ids["used"]) == {"u/1"}, 10, "object known")
    assert h.api.unregister(ids["dropped"]) == {"id": ids["dropped"], "forgotten": True}
    assert h.api.unregister(ids["dropped"]) is None                     # 404: no such registration
    assert h.http.get(f"/v1/views/{ids['dropped']}/objects").status_code == 404

    def log_ops():
        return [(e["op"], e["id"]) for e in h.http.get("/v1/views/log").json()["entries"]]

    def forgotten_idle():
        h.keys(ids["used"])                                             # "used" stays in use
        return ("forgotten", ids["idle"]) in log_ops()
    wait_until(forgotten_idle, 20, "the idle view forgotten")
    assert ids["used"] in {v["id"] for v in h.api.status()["views"]}
    assert log_ops()[:4] == [("registered", ids["used"]), ("registered", ids["dropped"]),
                             ("registered", ids["idle"]), ("forgotten", ids["dropped"])]
    # its mount comes back: registering again builds it from the bucket's stored objects
    s3.put_object(Bucket=bucket, Key="i/1", Body=b"x")
    wait_until(lambda: h.keys(ids["used"]) == {"u/1"} and h.api.lookup(bucket, "i/1") is not None, 10,
               "object known")
    again = register(h, s3, {"idle": spec(bucket, object="i/*")})
    assert again["idle"] == ids["idle"] and h.keys(ids["idle"]) == {"i/1"}


def test_small_view_of_a_big_bucket_pages_correctly(handler, s3, bucket, publisher):
    """A small view carved out by key prefix: correct pages, whatever keys surround it."""
    h = handler()
    ids = register(h, s3, {"sel": spec(bucket, object="sel/*.fq"), "all": spec(bucket)})
    base = time.time_ns()
    members = [f"sel/{i:03d}.fq" for i in range(70)]
    others = [f"a{i:04d}" for i in range(1500)] + ["sel", "sel0", "sel/x.txt", "sem/1.fq", "sek/1.fq"] \
        + [f"z{i:04d}" for i in range(1500)]
    for i, key in enumerate(members + others):
        publisher.publish("s3:ObjectCreated:Put", bucket, key, base + i, size=i, etag=f"e{i}")
    publisher.publish("s3:ObjectCreated:Put", bucket, "marker", base + 10**6, size=1, etag="m")
    wait_until(lambda: "marker" in h.keys(ids["all"]), 30, "all events applied")
    pages = [[o["key"] for o in page["objects"]] for page in h.pages(ids["sel"], limit=30)]
    assert [len(p) for p in pages] == [30, 30, 10]
    assert sum(pages, []) == members
    # pages longer than the part listed on the handler's loop (the rest in a worker thread)
    everything = sorted(members + others + ["marker"])
    for limit in (200, 201, 450, 5000):
        pages = [[o["key"] for o in page["objects"]] for page in h.pages(ids["all"], limit=limit)]
        assert sum(pages, []) == everything, limit
        assert [len(p) for p in pages[:-1]] == [limit] * (len(pages) - 1), limit
    # `after` before, inside and beyond the prefix range
    for after, want in (("a0001", members), ("sel/", members), ("sel/050.fq", members[51:]), ("sem", [])):
        page = h.http.get(f"/v1/views/{ids['sel']}/objects", params={"after": after}).json()
        assert [o["key"] for o in page["objects"]] == want, after
    # a removal inside the range leaves the view
    publisher.publish("s3:ObjectRemoved:Delete", bucket, "sel/000.fq", base + 2 * 10**6)
    wait_until(lambda: "sel/000.fq" not in h.keys(ids["sel"]), 10, "removed")
    assert h.keys(ids["sel"]) == set(members[1:])


def test_bucket_glob_views_are_refused(handler, s3, bucket):
    h = handler()
    proof = {bucket: presigned_list_url(s3, bucket)}
    r = h.register({"runs": {"bucket": "runs-*"}}, proof)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"] == "invalid_view"
    assert "bucket globs are not supported by this handler yet: name the bucket" in body["message"]
    assert "'runs-*'" in body["message"] and "'runs'" in body["message"]
    # with a valid view in the same request: nothing of the request is registered
    r = h.register({"ok": spec(bucket), "glob": {"bucket": bucket[:4] + "?" + bucket[5:]}}, proof)
    assert r.status_code == 400 and "not supported" in r.json()["message"]
    health = h.http.get("/healthz").json()
    assert health["views"] == 0 and health["buckets"] == {}
    assert register(h, s3, {"ok": spec(bucket)})["ok"]  # naming the bucket works


def test_reconcile_compacts_tombstones_and_lagging_clients_resync(handler, s3, bucket):
    for key in ("a", "b", "c"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    h = handler(extra_env={"DELVEFS_TOMBSTONE_HORIZON": "0"})
    vid = register(h, s3, {"all": spec(bucket)})["all"]
    listed_at, objects = h.list_all(vid)
    assert set(objects) == {"a", "b", "c"}
    s3.delete_object(Bucket=bucket, Key="b")
    r = h.http.get(f"/v1/views/{vid}/changes", params={"since": listed_at, "wait": 10}).json()
    assert [(c["op"], c["key"]) for c in r["changes"]] == [("delete", "b")]
    current = r["version"]

    counts = h.http.post("/v1/reconcile", params={"bucket": bucket}).json()["buckets"][bucket]
    assert counts["purged"] == 1
    # the client that listed before the delete can no longer be told about it: resync
    resp = h.http.get(f"/v1/views/{vid}/changes", params={"since": listed_at})
    assert resp.status_code == 410 and resp.json()["error"] == "resync"
    with h.http.stream("GET", f"/v1/views/{vid}/stream", params={"since": listed_at}) as stream:
        assert "event: resync" in next(stream.iter_lines())
    # a client that had seen the delete goes on with deltas
    s3.put_object(Bucket=bucket, Key="d", Body=b"x")
    r = h.http.get(f"/v1/views/{vid}/changes", params={"since": current, "wait": 10}).json()
    assert [(c["op"], c["key"]) for c in r["changes"]] == [("put", "d")]
    # the floor survives a restart; a fresh listing is complete
    h.stop()
    h2 = handler(state_dir=h.state_dir, queue=h.queue, extra_env={"DELVEFS_TOMBSTONE_HORIZON": "0"})
    assert h2.http.get(f"/v1/views/{vid}/changes", params={"since": listed_at}).status_code == 410
    assert set(h2.list_all(vid)[1]) == {"a", "c", "d"}
