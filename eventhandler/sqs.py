"""Consuming S3 bucket notifications from an SQS queue: the event source for AWS S3 (and
anything else that sends S3-format notifications to SQS), beside eventhandler/amqp.py.
``delvefs eventhandler --sqs-queue URL`` (or ``$DELVEFS_SQS_QUEUE``) uses it instead of
RabbitMQ; the SQS client is made by delvefs/shared/s3.py.

Guarantees, as on the AMQP path (the contract of eventhandler/batches.py):

- *Delete after commit*: a message is deleted from the queue only after its events are in a
  committed LevelDB batch. A handler that dies before leaves it in the queue; SQS delivers it
  again when its visibility timeout (``$DELVEFS_SQS_VISIBILITY``, default 120 s) ends, and
  applying it again changes nothing (per-key sequencers). The same holds for SQS's own
  duplicate deliveries (standard queues are at-least-once).
- *Dead letters*: a message that is no notification (not JSON, no ``Records``, a malformed
  record) or whose events fail to apply is sent to ``--sqs-dead-letter-queue`` (else to the
  queue's redrive target, if its RedrivePolicy names one) with the reason as message
  attribute ``delvefs-error``, then deleted; counted and logged, never a crash. Without any
  dead-letter queue it stays in the queue, invisible for 12 hours per attempt, and is logged:
  nothing is lost, nothing spins.
- A failed LevelDB write deletes and dead-letters nothing; consuming stops and the handler
  exits 3 (as on the AMQP path).

Receiving: ``$DELVEFS_SQS_POLLERS`` threads (default 2) each long-poll (``WaitTimeSeconds``
20) for batches of up to 10 messages and apply each batch in one WriteBatch. S3 errors of
receiving (network, throttling, credentials) are retried with backoff (0.2 s doubling to
10 s); meanwhile ``/healthz`` says ``"sqs": "reconnecting"``. Messages stay in SQS while the
handler cannot reach it, so no reconcile is needed afterwards. A monitor thread reads the
queue's ``ApproximateNumberOfMessages`` every few seconds (``delvefs_queue_messages``).

Message formats: S3's ``{"Records": [...]}``, also wrapped in an SNS notification
(``{"Type": "Notification", "Message": "<json>"}``: S3 -> SNS -> SQS fan-out);
``s3:TestEvent`` (sent by S3 when a notification configuration is saved) is deleted and
logged. Keys are URL-encoded with ``+`` for space (decoded by eventhandler/events.py). AWS
writes event names without the ``s3:`` prefix (``ObjectCreated:Put``) and a
``sequencer`` that orders the events of one key but is not a time: the sequencer the state
compares (per key, against other events and against a listing's LastModified) is then made
from ``eventTime`` (milliseconds); see docs/ARCHITECTURE.md for what that implies.
``LifecycleExpiration:Delete*`` events are removals; events that change neither content nor
existence (tagging, ACL, restore, replication, transitions) are skipped.
"""
from __future__ import annotations

import logging
import os
import threading
from datetime import datetime

import orjson

from delvefs.shared import s3

from .batches import BatchApplier, Received
from .events import InvalidEvent, parse_record, seq_hex
from .statedb import StorageError

log = logging.getLogger("delvefs.eventhandler.sqs")

KEEP_UNUSABLE = 12 * 3600  # seconds an unusable message stays invisible without a dead-letter queue
_SEQ_NS_MIN, _SEQ_NS_MAX = 10**18, 4 * 10**18  # as eventhandler/events.py: plausible epoch ns
# AWS event names that remove a key, by what they mean on the state
_REMOVALS = {"s3:LifecycleExpiration:Delete": "s3:ObjectRemoved:Delete",
             "s3:LifecycleExpiration:DeleteMarkerCreated": "s3:ObjectRemoved:DeleteMarkerCreated"}


class TestEvent(Exception):
    """The message is S3's ``s3:TestEvent`` (no change to apply)."""


def _event_time_ns(record: dict) -> int:
    when = record.get("eventTime")
    if isinstance(when, str):
        try:
            return int(datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp() * 1000) * 1_000_000
        except ValueError:
            pass
    raise InvalidEvent(f"no usable eventTime ({str(when)[:40]!r}) and no MinIO sequencer")


def _minio_sequencer(text) -> bool:
    """A sequencer that is epoch nanoseconds (MinIO's): compared as it is."""
    if not isinstance(text, str) or not 0 < len(text) <= 16:
        return False
    try:
        return _SEQ_NS_MIN <= int(text, 16) <= _SEQ_NS_MAX
    except ValueError:
        return False


def normalized_record(record) -> dict | None:
    """An S3 event record in the form eventhandler/events.py parses (MinIO's): ``s3:``
    prefixed event name, a 16-hex-digit sequencer that is epoch ns. None for an event that
    changes neither an object's content nor its existence. Raises InvalidEvent."""
    if not isinstance(record, dict):
        raise InvalidEvent("a record is not a JSON object")
    name = record.get("eventName")
    if not isinstance(name, str):
        raise InvalidEvent("eventName must be a string")
    name = name if name.startswith("s3:") else "s3:" + name
    name = _REMOVALS.get(name, name)
    if not (name.startswith("s3:ObjectCreated:") or name.startswith("s3:ObjectRemoved:")):
        return None
    s3_part = record.get("s3")
    obj = s3_part.get("object") if isinstance(s3_part, dict) else None
    if not isinstance(obj, dict):
        raise InvalidEvent("missing field 's3.object'")
    obj = dict(obj)
    if not _minio_sequencer(obj.get("sequencer")):
        # AWS: the sequencer orders one key's events but is no time; the state compares
        # sequencers with listings' LastModified too, so the event's time stands in for it
        obj["sequencer"] = seq_hex(_event_time_ns(record))
    return {**record, "eventName": name, "s3": {**s3_part, "object": obj}}


def parse_body(body: str | bytes) -> list:
    """The events of one SQS message body (S3 notification, possibly inside an SNS
    notification). Raises TestEvent for ``s3:TestEvent``, InvalidEvent for what is no
    usable notification."""
    try:
        doc = orjson.loads(body)
        if isinstance(doc, dict) and doc.get("Type") == "Notification" and isinstance(doc.get("Message"), str):
            doc = orjson.loads(doc["Message"])  # S3 -> SNS -> SQS
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidEvent("not a JSON object")
    if doc.get("Event") == "s3:TestEvent":
        raise TestEvent(str(doc.get("Bucket", "")))
    records = doc.get("Records")
    if not isinstance(records, list) or not records:
        raise InvalidEvent("no Records")
    events = []
    for record in records:
        norm = normalized_record(record)
        if norm is not None:
            events.append(parse_record(norm))
    return events


def _body_bucket(body: str) -> str | None:
    """The bucket an unusable message names, if it names one (for the dead letters' record)."""
    try:
        doc = orjson.loads(body)
        b = doc["Records"][0]["s3"]["bucket"]["name"]
        return b if isinstance(b, str) else None
    except Exception:  # noqa: BLE001 — unusable by definition
        return None


class SqsConsumer:
    kind = "sqs"  # the event source, as /healthz and /v1/status name it

    def __init__(self, queue_url: str, engine, metrics, *, dead_letter_url: str | None = None,
                 pollers: int | None = None, wait: int = 20, visibility: int | None = None,
                 client_factory=None, on_fatal=None, monitor_interval: float = 5.0, sharding=None):
        s3.sqs_endpoint(queue_url)  # a malformed URL fails the start, not every poll
        self.queue = queue_url
        # a shard's own queue: each bucket's notifications go to its owner's (delvefs notify)
        self.sharding = sharding
        self.dead = dead_letter_url
        self.engine = engine
        self.metrics = metrics
        self.pollers = pollers or int(os.environ.get("DELVEFS_SQS_POLLERS") or 2)
        self.wait = wait
        self.visibility = visibility or int(os.environ.get("DELVEFS_SQS_VISIBILITY") or 120)
        self.monitor_interval = monitor_interval
        self.applier = BatchApplier(engine, metrics, "SQS")
        self.state = "connecting"
        self.connected = threading.Event()
        self.last_error: str | None = None
        self.fatal: str | None = None
        self.depth: int | None = None  # messages waiting in the queue, as SQS last said
        self._factory = client_factory or (lambda: s3.make_sqs_client(queue_url))
        self._client = None
        self._prepared = False
        self._lock = threading.Lock()
        self._busy: set[threading.Thread] = set()  # pollers applying a batch (joined at stop)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._on_fatal = on_fatal or (lambda reason: None)
        self._test_events = 0

    # ---- life cycle ------------------------------------------------------------------

    def start(self) -> None:
        for i in range(self.pollers):
            t = threading.Thread(target=self._poll, name=f"delvefs-sqs-{i}", daemon=True)
            self._threads.append(t)
            t.start()
        t = threading.Thread(target=self._monitor, name="delvefs-sqs-depth", daemon=True)
        self._threads.append(t)
        t.start()

    def stop(self, timeout: float = 30) -> None:
        """Finish the batches in hand (their messages deleted); pollers waiting in a long
        poll are left to end with the process: what they receive from now on is not applied
        and comes back after its visibility timeout."""
        with self._lock:
            self._stopping.set()
            busy = list(self._busy)
        for t in busy:
            t.join(timeout)
        self.connected.clear()
        self.state = "stopped"

    # ---- the client --------------------------------------------------------------------

    def _sqs(self):
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            client = self._client
        if not self._prepared:
            self._prepare(client)
        return client

    def _prepare(self, client) -> None:
        """Find the dead-letter queue: the one given, else the queue's redrive target."""
        attrs = s3.sqs_attributes(client, self.queue)
        with self._lock:
            if self._prepared:
                return
            if self.dead is None and attrs.get("RedrivePolicy"):
                try:
                    arn = orjson.loads(attrs["RedrivePolicy"])["deadLetterTargetArn"]
                    self.dead = s3.sqs_queue_url(client, arn)
                except Exception as exc:  # noqa: BLE001 — then keep unusable messages instead
                    log.warning("queue %s: cannot use the dead-letter queue of its RedrivePolicy (%s)",
                                self.queue, exc)
            if self.dead is None:
                log.warning("queue %s has no dead-letter queue (--sqs-dead-letter-queue, or a "
                            "RedrivePolicy): unusable messages are logged and left in it, invisible "
                            "for %d h at a time", self.queue, KEEP_UNUSABLE // 3600)
            else:
                log.info("unusable messages of %s go to %s", self.queue, self.dead)
            self._prepared = True

    def _reachable(self) -> None:
        if self.state != "connected":
            log.info("consuming SQS queue %s (%d pollers, long polls of %d s, visibility %d s)",
                     self.queue, self.pollers, self.wait, self.visibility)
        self.state = "connected"
        self.last_error = None
        self.connected.set()

    def _unreachable(self, exc: Exception, backoff: float) -> None:
        self.connected.clear()
        self.state = "reconnecting"
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("SQS queue %s: %s; retrying in %.1f s", self.queue, self.last_error, backoff)

    # ---- pollers -------------------------------------------------------------------------

    def _poll(self) -> None:
        backoff = 0.2
        while not self._stopping.is_set():
            try:
                client = self._sqs()
                if not self.connected.is_set():  # say so now, not after a long poll of nothing
                    s3.sqs_attributes(client, self.queue)
                    self._reachable()
                received = s3.sqs_receive(client, self.queue, wait=self.wait, visibility=self.visibility)
            except Exception as exc:  # noqa: BLE001 — network, throttling, credentials: retried
                self._unreachable(exc, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.2
            self._reachable()
            if not received:
                continue
            with self._lock:
                if self._stopping.is_set():
                    self._release(client, received)
                    return
                self._busy.add(threading.current_thread())
            try:
                self._handle(client, received)
            except StorageError as exc:  # before the rest: plyvel.IOError is an OSError
                self._stop_for_storage(exc)
                return
            except Exception as exc:  # noqa: BLE001 — deleting failed, or a bug: redelivered later
                log.exception("SQS batch of %d messages failed (they return after the visibility "
                              "timeout)", len(received))
                self.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                with self._lock:
                    self._busy.discard(threading.current_thread())

    def _release(self, client, received) -> None:
        """Received while stopping: make them visible again at once (best effort)."""
        try:
            s3.sqs_set_visibility(client, self.queue, [m["receipt"] for m in received], 0)
        except Exception:  # noqa: BLE001 — they come back after the visibility timeout anyway
            pass

    def _stop_for_storage(self, exc: Exception) -> None:
        with self._lock:
            if self.fatal is not None:
                return
            self.fatal = self.last_error = f"LevelDB: {exc}"
            self._stopping.set()
        self.connected.clear()
        self.state = "stopped"
        self.metrics.storage_errors.inc()
        log.error("writing the state failed (%s): consuming stopped; the batch in hand was neither "
                  "deleted nor dead-lettered and waits in %s for a restart", exc, self.queue)
        self._on_fatal(self.fatal)

    def _handle(self, client, received: list[dict]) -> None:
        """Apply one received batch, dead-letter its unusable messages, delete the rest."""
        tracked = self.engine.tracked
        messages, done = [], []  # done: nothing to apply (test events, untracked buckets)
        dropped = 0
        for m in received:
            body = m["body"]
            try:
                events = parse_body(body)
            except TestEvent as test:
                self._test_events += 1
                log.info("s3:TestEvent for bucket %s on %s (the bucket's notifications reach "
                         "this queue)", test, self.queue)
                done.append(m["receipt"])
                continue
            except InvalidEvent as exc:
                messages.append(Received(m["receipt"], error=str(exc), bucket=_body_bucket(body),
                                         body=body.encode()))
                continue
            kept = [e for e in events if e.bucket in tracked]
            if self.sharding is not None:  # a bucket wired to this queue that another shard owns
                self.sharding.foreign_events += sum(1 for e in events if not self.sharding.owns(e.bucket))
                kept = [e for e in kept if self.sharding.owns(e.bucket)]
            dropped += len(events) - len(kept)
            if kept:
                messages.append(Received(m["receipt"], kept, body=body.encode()))
            else:
                done.append(m["receipt"])
        if dropped:
            self.metrics.dropped.inc(dropped)
        dead = self.applier.apply(messages, received=len(received))
        dead_tags = {d.tag for d in dead}
        delete = done + [m.tag for m in messages if m.tag not in dead_tags]
        for d in dead:
            if self._dead_letter(client, d):
                delete.append(d.tag)
        if delete:
            failed = s3.sqs_delete(client, self.queue, delete)
            if failed:  # applied already: a redelivery changes nothing
                log.warning("SQS: %d applied messages not deleted (%s); their redelivery changes nothing",
                            len(failed), failed[0])

    def _dead_letter(self, client, m: Received) -> bool:
        """Send ``m`` to the dead-letter queue (True: delete it from the queue), or, without
        one, keep it invisible for a long while (False)."""
        if self.dead is not None:
            try:
                s3.sqs_send(client, self.dead, m.body.decode("utf-8", "replace"),
                            {"delvefs-error": m.error or "unusable", "delvefs-source": self.queue})
            except Exception as exc:  # noqa: BLE001 — not sent: not deleted either; retried later
                log.warning("SQS: cannot send an unusable message to %s (%s): it stays in %s",
                            self.dead, exc, self.queue)
                return False
            self.applier.dead_lettered(m, self.dead)
            return True
        try:
            s3.sqs_set_visibility(client, self.queue, [m.tag], KEEP_UNUSABLE)
        except Exception:  # noqa: BLE001 — it comes back after the visibility timeout
            pass
        self.applier.dead_lettered(m, f"{self.queue} (kept: no dead-letter queue)")
        return False

    # ---- queue depth -------------------------------------------------------------------

    def _monitor(self) -> None:
        while not self._stopping.wait(self.monitor_interval if self.depth is not None else 0.5):
            if not self.connected.is_set():
                continue
            try:
                attrs = s3.sqs_attributes(self._sqs(), self.queue)
                self.depth = int(attrs.get("ApproximateNumberOfMessages", 0))
                self.metrics.set_queue_depth(self.depth)
            except Exception:  # noqa: BLE001 — the pollers report SQS being away
                pass
