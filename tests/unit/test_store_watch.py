"""The handler after the object store failed: the store watch notices an outage (its probes
or the handler's own requests get no answer) and a restart (a shorter uptime than the time
since it was last seen up) and reconciles; a key a mount waits for is checked in S3 and
repaired at once; the reconcile metrics tell repairs that changed a view from checks."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest

from eventhandler import statedb as st
from eventhandler.devtools import spec
from eventhandler.engine import Engine
from eventhandler.metrics import Metrics
from eventhandler.storewatch import StoreWatch
from tests.unit.test_handler_engine import FakeBucketReader, ready, keys
from tests.waiting import wait_until


class Unreachable(ConnectionRefusedError):
    pass


class ProbedReader(FakeBucketReader):
    """The fake reader with what the store watch and key checks use: ``probe``,
    ``store_uptime`` and ``head``; ``down`` makes every request fail unanswered."""

    def __init__(self):
        super().__init__()
        self.down = False
        self.started = time.monotonic() - 100  # the store's start, for its uptime
        self.tells_uptime = True
        self.probes = 0

    def probe(self, bucket):
        self.probes += 1
        if self.down:
            raise Unreachable("connection refused")

    def store_uptime(self):
        return time.monotonic() - self.started if self.tells_uptime else None

    def head(self, bucket, key):
        if self.down:
            raise Unreachable("connection refused")
        o = self.objects.get(key)
        if o is None:
            return None
        return {"etag": o["ETag"], "size": o["Size"], "mtime": o["LastModified"].timestamp(),
                "metadata": dict(o.get("metadata", {}))}


def put(fake, key, etag, size=1):
    fake.objects[key] = {"Size": size, "ETag": etag, "tags": {},
                         "LastModified": datetime.now(timezone.utc)}


@pytest.fixture
def engine(tmp_path):
    fake = ProbedReader()
    store = st.Store(str(tmp_path / "db"))
    eng = Engine(store, Metrics(), s3=fake, s3_workers=2, job_workers=1,
                 store_probe_interval=0.05, store_settle=0.2, store_events_wait=0.5)
    eng.start()
    eng.fake = fake
    yield eng
    eng.close()
    store.close()


def metric(eng, name, **labels):
    value = eng.metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


def test_a_waited_for_key_without_its_event_is_repaired_from_s3(engine):
    fake = engine.fake
    put(fake, "data/a", "e1")
    vid = engine.register([("all", spec("b", object="data/*"))])[0]["id"]
    info = ready(engine, vid)
    assert keys(engine, info) == ["data/a"]
    put(fake, "data/lost", "e2")  # S3 has it; its event never came
    put(fake, "other/lost", "e3")  # no view shows it
    del fake.objects["data/a"]  # removed, its event lost too
    counts = engine.check_keys("b", ["data/lost", "other/lost", "data/a", "data/lost"])
    assert counts["listed"] == 3 and counts["repaired"] == 2 and counts["removed"] == 1
    assert counts["view_changes"] == 2  # data/lost joined, data/a left; other/lost shows nowhere
    assert keys(engine, info) == ["data/lost"]
    assert engine.lookup("b", "other/lost")["etag"] == "e3"
    assert metric(engine, "delvefs_reconcile_checks_total") == 3
    assert metric(engine, "delvefs_reconcile_repairs_total", effect="view") == 2
    assert metric(engine, "delvefs_reconcile_repairs_total", effect="state") == 1
    # asked again: nothing is wrong any more
    again = engine.check_keys("b", ["data/lost", "other/lost", "data/a"])
    assert again["repaired"] == again["removed"] == again["view_changes"] == 0


def test_a_reconcile_counts_checks_apart_from_repairs(engine):
    fake = engine.fake
    for i in range(5):
        put(fake, f"data/{i}", f"e{i}")
    vid = engine.register([("all", spec("b", object="data/*"))])[0]["id"]
    ready(engine, vid)
    checks = metric(engine, "delvefs_reconcile_checks_total")
    assert metric(engine, "delvefs_reconcile_repairs_total", effect="view") == 0  # a first scan is none
    counts = engine.reconcile("b")["b"]
    assert counts["listed"] == 5 and counts["view_changes"] == 0
    assert metric(engine, "delvefs_reconcile_checks_total") == checks + 5
    assert metric(engine, "delvefs_reconcile_repairs_total", effect="view") == 0
    put(fake, "data/late", "e9")
    counts = engine.reconcile("b")["b"]
    assert counts["repaired"] == 1 and counts["view_changes"] == 1
    assert metric(engine, "delvefs_reconcile_repairs_total", effect="view") == 1


def test_an_outage_is_repaired_once_the_store_answers_again(engine):
    fake = engine.fake
    vid = engine.register([("all", spec("b"))])[0]["id"]
    info = ready(engine, vid)
    watch = engine.store_watch
    wait_until(lambda: fake.probes > 0, 10, "probing")
    fake.down = True
    wait_until(lambda: not watch.status()["reachable"], 10, "outage noticed")
    assert metric(engine, "delvefs_store_outages_total", kind="unreachable") == 1
    put(fake, "written-meanwhile", "e1")  # its event lost with the outage
    assert keys(engine, info) == []
    fake.down = False
    wait_until(lambda: keys(engine, info) == ["written-meanwhile"], 10, "repaired by a reconcile")
    wait_until(lambda: watch.repairs == 1, 10, "the repair counted")
    assert watch.status()["reachable"]
    assert metric(engine, "delvefs_reconcile_repairs_total", effect="view") == 1


def test_a_restart_between_two_probes_shows_by_the_uptime(engine):
    fake = engine.fake
    vid = engine.register([("all", spec("b"))])[0]["id"]
    info = ready(engine, vid)
    watch = engine.store_watch
    wait_until(lambda: fake.probes > 2, 10, "probing")
    put(fake, "put-as-it-restarted", "e1")
    fake.started = time.monotonic()  # restarted this instant: no probe ever failed
    wait_until(lambda: keys(engine, info) == ["put-as-it-restarted"], 10, "repaired")
    assert watch.status()["reachable"]
    assert metric(engine, "delvefs_store_outages_total", kind="restart") == 1
    assert metric(engine, "delvefs_store_outages_total", kind="unreachable") == 0


def test_the_handlers_own_failed_request_counts_as_an_outage(tmp_path):
    """No probes (interval 0): a tag fetch that got no answer marks the store unreachable; a
    probe then runs until it answers, and the buckets are reconciled."""
    fake = ProbedReader()
    repaired = threading.Event()
    stopping = threading.Event()
    watch = StoreWatch(fake, lambda: ["b"], lambda: (repaired.set(), {})[1], Metrics(), stopping,
                       interval=0, settle=0.05, events_wait=0.1)
    t = threading.Thread(target=watch.run, daemon=True)
    t.start()
    try:
        assert fake.on_unreachable == watch.failed
        fake.down = True
        fake.on_unreachable(Unreachable("connection refused"))
        assert not watch.status()["reachable"]
        wait_until(lambda: fake.probes > 0, 10, "probing while unreachable")
        assert not repaired.is_set()
        fake.down = False
        assert repaired.wait(10)
        assert watch.status()["reachable"]
    finally:
        stopping.set()
        watch.wake()
        t.join(5)


def test_a_store_that_answers_an_error_is_reachable(tmp_path):
    """A 403 or 404 of the probe is an answer: no outage, no repair."""
    from delvefs.shared.s3lean import S3Error
    fake = ProbedReader()

    def refusing(bucket):
        fake.probes += 1
        raise S3Error("AccessDenied", 403, "no")
    fake.probe = refusing
    fake.tells_uptime = False
    calls = []
    watch = StoreWatch(fake, lambda: ["b"], lambda: calls.append(1) or {}, Metrics(),
                       threading.Event(), interval=1, settle=0)
    watch.probe_once()
    watch.probe_once()
    assert watch.status()["reachable"] and not calls


def test_a_repair_before_the_stores_events_flow_again_runs_once_more_when_they_do():
    """A restarted MinIO drops the events of its first moments: the repair lists the bucket
    after the settle time, and — no event of a change made since the store came back having
    arrived by then — once more after one does (then every PUT whose event was lost is in
    the listing)."""
    fake = ProbedReader()
    metrics = Metrics()
    metrics.newest_event = time.time()
    runs = []
    stopping = threading.Event()
    watch = StoreWatch(fake, lambda: ["b"], lambda: (runs.append(time.time()), {})[1], metrics,
                       stopping, interval=0.02, settle=0.05, events_wait=60)
    t = threading.Thread(target=watch.run, daemon=True)
    t.start()
    try:
        fake.down = True
        wait_until(lambda: not watch.status()["reachable"], 10, "outage noticed")
        fake.down = False
        wait_until(lambda: len(runs) == 1, 10, "the first repair, after the settle time")
        assert watch.status()["repair_pending"]  # the second waits for an event
        metrics.newest_event = time.time() + 1  # an event of a PUT made after it came back
        wait_until(lambda: len(runs) == 2, 10, "the second repair, once events flow")
        assert not watch.status()["repair_pending"]
        metrics.newest_event += 1
        fake.down = True  # another outage, the events flowing at once: one repair
        wait_until(lambda: not watch.status()["reachable"], 10, "outage noticed")
        fake.down = False
        wait_until(lambda: len(runs) == 3, 10, "its repair")
        assert not watch.status()["repair_pending"]  # (events flowed before it: no second one)
    finally:
        stopping.set()
        watch.wake()
        t.join(5)


def test_delvefs_status_says_whether_the_store_answers():
    from delvefs.client.commands.status import format_handler
    base = {"principal": "p", "uptime": 5, "buckets": {}, "views": [], "groups": [],
            "dead_letters": {"count": 0, "recent": []},
            "source": {"kind": "amqp", "queue": "q", "state": "connected", "messages": 0,
                       "newest_event_age": None}}
    up = format_handler({**base, "store": {"reachable": True, "unreachable_seconds": None,
                                           "last_error": None, "repair_pending": False, "repairs": 2}})
    assert "object store: reachable; 2 reconcile(s) after outages" in up
    down = format_handler({**base, "store": {"reachable": False, "unreachable_seconds": 12.0,
                                             "last_error": "ConnectionRefusedError: refused",
                                             "repair_pending": True, "repairs": 0}})
    assert "object store: UNREACHABLE for" in down and "ConnectionRefusedError" in down
    assert "a reconcile after its outage is due" in down
    assert "object store" not in format_handler(base)  # an older handler tells nothing


def test_a_store_that_started_just_before_the_handler_first_asked_is_repaired_too():
    """A store first seen up a few seconds may have restarted (and lost events) just before
    this handler could see it: once it has been up the settle time, the buckets are
    reconciled. One up for long is not."""
    for up_since, repairs in ((2.0, 1), (100.0, 0)):
        fake = ProbedReader()
        fake.started = time.monotonic() - up_since
        calls = []
        watch = StoreWatch(fake, lambda: ["b"], lambda: calls.append(1) or {}, Metrics(),
                           threading.Event(), interval=1, settle=0.0, events_wait=0)
        watch.probe_once()
        watch._repair_if_due()
        assert len(calls) == repairs, up_since


def test_whole_second_uptimes_of_one_start_are_no_restart():
    """MinIO tells its uptime in whole seconds: answers of the same start imply start times
    up to a second apart, never a restart; a start after all of them is one."""
    fake = ProbedReader()
    clock = [1000.0]
    fake.store_uptime = lambda: float(int(clock[0] - 900.3))  # started at 900.3
    calls = []
    watch = StoreWatch(fake, lambda: ["b"], lambda: calls.append(1) or {}, Metrics(),
                       threading.Event(), interval=1, settle=0.0, events_wait=0)
    real = time.monotonic
    try:
        time.monotonic = lambda: clock[0]
        for step in (0.0, 0.5, 0.4, 0.9, 0.2, 1.7):
            clock[0] += step
            watch.probe_once()
        assert not calls and watch._repair_due is None
        fake.store_uptime = lambda: float(int(clock[0] - 1004.0))  # restarted at 1004.0
        clock[0] += 0.6
        watch.probe_once()
        assert watch._repair_due is not None
    finally:
        time.monotonic = real
