"""Consuming MinIO's notifications from RabbitMQ (pika; the only module importing pika).
``EventPublisher`` publishes such notifications for tests and benchmarks.

Topology (declared idempotently on every connect):

- exchange ``X`` (default ``delvefs``): fanout, durable — exactly as MinIO declares it (it
  re-declares on each publish; other flags would make one of us fail);
- queue ``Q`` = ``X.handler`` (or $DELVEFS_AMQP_QUEUE): durable, bound to ``X``, so events
  published while the handler is down wait for it; ``x-dead-letter-exchange`` = ``Q.dead``;
  ``x-single-active-consumer``: of several consumers only one receives messages, the next
  takes over when it goes — two handlers never split the events (a standby waits for the
  state lock before it consumes at all: eventhandler/standby.py; a second handler with
  another state directory is told loudly that it receives nothing);
- exchange ``Q.dead`` (fanout, durable) and queue ``Q.dead`` bound to it: messages the
  handler cannot use (not JSON, not a MinIO event, an event that fails to apply) are
  rejected without requeue and land there — logged, counted, never redelivered.

One thread (``Consumer``) owns the BlockingConnection and its channel. It collects what is
available (up to ``max_batch`` messages), drops messages of untracked buckets by their
``minio-bucket`` header without decoding them, applies the rest through ``Engine.apply_events``
(one LevelDB WriteBatch), then rejects the invalid ones and acks the batch with one
``multiple=True`` ack — the contract of eventhandler/batches.py, shared with the SQS source. A lost connection is retried with exponential backoff (0.2 s .. 2 s; 5 s to connect);
unacked messages are redelivered by the broker and re-applying them changes nothing. When a
connection succeeds after failed attempts, the tracked buckets are reconciled: MinIO without
a queue dir drops the events it cannot publish while the broker is away.

A *fence* (``request_fence``) tells a caller when everything the queue held at the moment
it asked has been applied: the consumer thread publishes a message with the header
``x-delvefs-fence`` to its own queue (default exchange), and the batch that brings it back
calls the caller once its events are committed. A queue delivers to its one active consumer
in order, so every event enqueued before the fence (an object whose PUT returned, when MinIO
publishes synchronously) is applied by then. Fence messages are acked with their batch and
never applied or dead-lettered. A handler that is not consuming sets no fence.

A handler that is one shard (``--shard``, eventhandler/sharding.py) gets only its own
buckets' events, routed by the broker: a headers exchange ``X.buckets``, bound to ``X``
(exchange-to-exchange), routes on MinIO's ``minio-bucket`` header; the shard's queue (default
``X.shard.NAME``) has one binding per bucket it owns and tracks, made before the bucket's
first scan begins (``bind``) and removed when it hands the bucket off (``release``). No shard
receives another shard's events (``foreign_events`` counts any that would: zero).

``--quorum-queue`` ($DELVEFS_AMQP_QUORUM=1) declares the queue as a quorum queue (replicated
on a RabbitMQ cluster; single-active-consumer as well). A queue declared otherwise — by an
older handler without single-active-consumer, or as the other type — cannot be redeclared
(PRECONDITION_FAILED). The consumer then moves it without losing a message: it binds a
temporary queue ``Q.upgrade`` as ``Q`` is bound and unbinds ``Q`` (every event is in one of
them), applies what is left in ``Q`` and deletes it (only if empty and unused), declares
``Q`` anew, then applies and deletes ``Q.upgrade``; an interrupted move resumes at the next
connect. Events in both queues meanwhile are applied twice, which changes nothing.

A LevelDB write that fails (``StorageError``: disk full, I/O error) is not the events' fault:
nothing of that batch is acked or dead-lettered, the consumer closes its connection (the
broker keeps the messages) and reports ``fatal``; the handler then exits non-zero, because
LevelDB may refuse every later write until it is reopened. A restart re-applies the batch.
"""
from __future__ import annotations

import logging
import itertools
import os
import threading
import time

import pika
import pika.exceptions

from .batches import BatchApplier, Received
from .events import InvalidEvent, message_bucket, parse_message
from .statedb import StorageError

log = logging.getLogger("delvefs.eventhandler.amqp")

FENCE_HEADER = "x-delvefs-fence"


def queue_names(exchange: str, queue: str | None = None, shard: str | None = None) -> tuple[str, str]:
    """(handler queue, its dead-letter exchange/queue) for an exchange (and a shard)."""
    queue = queue or os.environ.get("DELVEFS_AMQP_QUEUE") or (
        f"{exchange}.shard.{shard}" if shard else f"{exchange}.handler")
    return queue, f"{queue}.dead"


def bucket_exchange(exchange: str) -> str:
    """The headers exchange that routes a sharded deployment's events by bucket."""
    return f"{exchange}.buckets"


def bucket_binding(bucket: str) -> dict:
    """The arguments of a shard queue's binding for one bucket (MinIO's header)."""
    return {"x-match": "all", "minio-bucket": bucket}


def declare_exchange(channel, exchange: str) -> None:
    """The events' exchange, exactly as MinIO declares it."""
    channel.exchange_declare(exchange, exchange_type="fanout", durable=True)


UPGRADE_SUFFIX = ".upgrade"  # the temporary queue while a queue is declared anew
PRECONDITION_FAILED = 406
NOT_FOUND = 404


def _is_upgrade_probe(record: logging.LogRecord) -> bool:
    """pika's warning about a channel the broker closed because an upgrade queue does not
    exist: the expected answer to looking for one at every connect."""
    args = record.args if isinstance(record.args, tuple) else ()
    return len(args) >= 2 and args[0] == NOT_FOUND and UPGRADE_SUFFIX + "'" in str(args[1])


logging.getLogger("pika.channel").addFilter(lambda record: not _is_upgrade_probe(record))


def queue_arguments(dead: str, quorum: bool = False) -> dict:
    args = {"x-dead-letter-exchange": dead, "x-single-active-consumer": True}
    if quorum:  # replicated (Raft) on a cluster; needs durable, which every handler queue is
        args["x-queue-type"] = "quorum"
    return args


def declare_bucket_exchange(channel, exchange: str) -> str:
    """A sharded deployment's routing: the headers exchange bound to MinIO's exchange."""
    routing = bucket_exchange(exchange)
    channel.exchange_declare(routing, exchange_type="headers", durable=True)
    channel.exchange_bind(routing, exchange)
    return routing


def declare(channel, exchange: str, queue: str, dead: str, *, quorum: bool = False,
            sharded: bool = False) -> int:
    """Declare the topology; returns how many consumers the queue already has. Unsharded,
    the queue is bound to the exchange itself; ``sharded``, to nothing yet (its buckets'
    bindings to the bucket exchange are the consumer's)."""
    declare_exchange(channel, exchange)
    channel.exchange_declare(dead, exchange_type="fanout", durable=True)
    channel.queue_declare(dead, durable=True)
    channel.queue_bind(dead, dead)
    declared = channel.queue_declare(queue, durable=True, arguments=queue_arguments(dead, quorum))
    if sharded:
        declare_bucket_exchange(channel, exchange)
    else:
        channel.queue_bind(queue, exchange)
    return declared.method.consumer_count


def queue_stats(channel, queue: str):
    """``.message_count`` (waiting, not counting unacked) and ``.consumer_count`` of
    ``queue`` (which must exist)."""
    return channel.queue_declare(queue, durable=True, passive=True).method


def queue_depth(channel, queue: str) -> int:
    """How many messages wait in ``queue`` (which must exist)."""
    return queue_stats(channel, queue).message_count


def declared_otherwise(exc: Exception) -> bool:
    """The broker refused to redeclare a queue declared with other arguments: without
    single-active-consumer (an older handler), or of the other type (classic / quorum)."""
    return (isinstance(exc, pika.exceptions.ChannelClosedByBroker)
            and exc.reply_code == PRECONDITION_FAILED
            and ("x-single-active-consumer" in exc.reply_text or "x-queue-type" in exc.reply_text))


def other_consumers_message(queue: str, n: int) -> str:
    return (f"queue {queue} has {n} other consumer(s): another handler with a different "
            f"--state-dir (or the connection of one that died and that the broker has not "
            f"dropped yet: up to two heartbeats)? Only one consumer of the queue receives events "
            f"(single active consumer), the others none until it goes away. A standby must "
            f"share the active handler's --state-dir: it then waits for the state lock instead")


class LagMonitor(threading.Thread):
    """Samples the queue's depth (messages waiting = lag) on its own connection every
    ``interval`` seconds, so the consumer never waits for that round trip."""

    def __init__(self, url: str, queue: str, gauge, interval: float = 2.0, ready=None):
        """``gauge(n)`` takes each sample (``Metrics.set_queue_depth``)."""
        super().__init__(name="delvefs-amqp-lag", daemon=True)
        self.url, self.queue, self.gauge, self.interval = url, queue, gauge, interval
        self.ready = ready or (lambda: True)  # the consumer has declared the queue
        self._stopping = threading.Event()
        self._warned_at = float("-inf")  # when other consumers of the queue were last reported

    def stop(self) -> None:
        self._stopping.set()
        self.join(5)

    def run(self) -> None:
        conn = ch = None
        while not self._stopping.wait(self.interval):
            if not self.ready():
                continue
            try:
                if conn is None or not conn.is_open:
                    conn = pika.BlockingConnection(pika.URLParameters(self.url))
                    ch = None
                if ch is None or not ch.is_open:
                    ch = conn.channel()
                stats = queue_stats(ch, self.queue)
                self.gauge(stats.message_count)
                if stats.consumer_count > 1 and time.monotonic() - self._warned_at > 60:
                    self._warned_at = time.monotonic()
                    log.error("%s", other_consumers_message(self.queue, stats.consumer_count - 1))
            except Exception:  # the broker is away or the queue not declared yet: try later
                if conn is not None and not conn.is_open:
                    conn = None
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except Exception:
                pass


class Consumer(threading.Thread):
    kind = "amqp"  # the event source, as /healthz and /v1/status name it
    OUTAGE_SETTLE = 3.0  # s after a broker outage before the queue is fenced and buckets reconciled
    OUTAGE_EVENTS_WAIT = 30.0  # s at most that reconcile waits for the store's events to flow again

    def __init__(self, url: str, exchange: str, engine, metrics, *, queue: str | None = None,
                 prefetch: int = 4000, max_batch: int = 2000, on_fatal=None, sharding=None,
                 quorum: bool = False):
        super().__init__(name="delvefs-amqp", daemon=True)
        self.url = url
        self.exchange = exchange
        # a shard (eventhandler/sharding.py) binds its queue for each bucket it owns
        self.sharding = sharding
        self.quorum = quorum
        self.queue, self.dead = queue_names(exchange, queue, sharding.shard if sharding else None)
        self._conn = None  # the connection while consuming (bindings change through it)
        self._channel = None  # its consuming channel
        self._bound_for: frozenset | None = None  # the tracked buckets the bindings were made for
        self._in_hand = 0  # messages received and not yet applied
        self.engine = engine
        self.metrics = metrics
        self.prefetch = prefetch
        self.max_batch = max_batch
        self.state = "connecting"
        self.connected = threading.Event()
        self._stopping = threading.Event()
        self.applier = BatchApplier(engine, metrics, "AMQP")
        self.last_error: str | None = None
        self.fatal: str | None = None  # why consuming stopped for good (the state cannot be written)
        self.unreachable_since: float | None = None  # monotonic time of the first failed connect
        self._on_fatal = on_fatal or (lambda reason: None)
        self._fences: dict[str, object] = {}  # fence id -> its callback (any thread)
        # ids of this process alone: a fence an earlier handler left in the queue passes nothing
        self._fence_ids = (f"{os.urandom(8).hex()}-{n}" for n in itertools.count(1))

    def stop(self, timeout: float = 30) -> None:
        """Finish the batch in hand, ack it, close the connection."""
        self._stopping.set()
        self.join(timeout)

    def run(self) -> None:
        backoff = 0.2
        while not self._stopping.is_set():
            try:
                self._consume()
                backoff = 0.2
            except StorageError as exc:  # before OSError: plyvel.IOError is one
                self.connected.clear()
                self.state = "stopped"
                self.fatal = self.last_error = f"LevelDB: {exc}"
                self.metrics.storage_errors.inc()
                log.error("writing the state failed (%s): consuming stopped; the batch in hand was "
                          "neither acknowledged nor dead-lettered and waits in %s for a restart",
                          exc, self.queue)
                self._on_fatal(self.fatal)
                return
            except (pika.exceptions.AMQPError, OSError) as exc:
                self.connected.clear()
                self.state = "reconnecting"
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self.unreachable_since is None:
                    self.unreachable_since = time.monotonic()
                log.warning("AMQP connection lost (%s); reconnecting in %.1f s", self.last_error, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:  # a bug: log it, never spin
                self.connected.clear()
                self.state = "reconnecting"
                log.exception("consumer failed; restarting it in %.1f s", backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        self.state = "stopped"

    def _consume(self) -> None:
        params = pika.URLParameters(self.url)
        params.heartbeat = 30
        params.connection_attempts = 1
        params.socket_timeout = 5
        params.stack_timeout = 5  # a broker that accepts TCP but stalls (still booting): retry
        conn = pika.BlockingConnection(params)
        self._bound_for = None
        try:
            ch, others = self._declare(conn)
            if self._stopping.is_set():  # while an upgrade drained a queue
                return
            ch.basic_qos(prefetch_count=self.prefetch)
            self.state = "connected"
            self.connected.set()
            if self.unreachable_since is not None:
                self._reconcile_after_outage(time.monotonic() - self.unreachable_since)
                self.unreachable_since = None
            if others:
                log.error("%s", other_consumers_message(self.queue, others))
            log.info("consuming %s (%s queue bound to %s; single active consumer)", self.queue,
                     "quorum" if self.quorum else "classic",
                     f"{bucket_exchange(self.exchange)} for the buckets of shard {self.sharding.shard}"
                     if self.sharding else f"exchange {self.exchange}")
            self._conn = conn
            self._receive(conn, ch, self.queue)
        finally:
            self._conn = self._channel = None
            self.connected.clear()
            try:
                if conn.is_open:
                    conn.close()
            except Exception:
                pass

    def _reconcile_after_outage(self, seconds: float) -> None:
        """While this handler could not reach the broker, MinIO most likely could not either,
        and without a queue dir it dropped those events (publisher confirms make it log them,
        not keep them): re-list the tracked buckets now rather than at the next periodic
        reconcile — after ``OUTAGE_SETTLE`` seconds and a fence through the queue, so that
        the events that did come (MinIO's queue dir, other publishers retrying) are applied
        first and the repairs counted are the events that were lost, not late. MinIO
        reconnects to the broker in its own time and drops events until then: when no event
        of a change made since the broker came back has arrived by that reconcile, it runs
        once more when one does (or ``OUTAGE_EVENTS_WAIT`` s later)."""
        log.warning("the broker was unreachable for %.1f s: reconciling the tracked buckets "
                    "once the queue is drained (events MinIO could not publish meanwhile)", seconds)

        back = time.time()

        def drained_then_reconciled() -> bool:
            drained = threading.Event()
            passed = drained.set
            if self.request_fence(passed) and not drained.wait(60):
                self.drop_fence(passed)
            if self._stopping.is_set():
                return False
            self.engine.reconcile()
            return True

        def reconcile() -> None:
            try:
                if self._stopping.wait(self.OUTAGE_SETTLE):
                    return
                flowing = self.metrics.newest_event >= back
                if not drained_then_reconciled() or flowing:
                    return
                # reconciled before the store's events flowed again: once more when they do
                deadline = time.monotonic() + self.OUTAGE_EVENTS_WAIT
                while self.metrics.newest_event < back and time.monotonic() < deadline:
                    if self._stopping.wait(0.1):
                        return
                drained_then_reconciled()
            except Exception:  # the engine logs what failed; stopping also ends up here
                if not self._stopping.is_set():
                    log.exception("reconcile after the broker outage failed")
        threading.Thread(target=reconcile, name="delvefs-reconcile-after-outage", daemon=True).start()

    def _declare(self, conn):
        """A channel with the topology declared (upgrading a queue of an older handler
        first) and how many other consumers the queue has."""
        ch = conn.channel()
        options = {"quorum": self.quorum, "sharded": self.sharding is not None}
        try:
            others = declare(ch, self.exchange, self.queue, self.dead, **options)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if not declared_otherwise(exc):
                raise
            self._upgrade_queue(conn, exc.reply_text)
            if self._stopping.is_set():  # resumed at the next start
                return ch, 0
            ch = conn.channel()
            others = declare(ch, self.exchange, self.queue, self.dead, **options)
        self._sync_bindings(ch, self.queue)
        self._finish_upgrade(conn)
        return ch, others

    # ---- a shard's bindings: one per bucket it owns and tracks -----------------------

    def _owned_tracked(self) -> set[str]:
        return {b for b in self.engine.tracked if self.sharding.owns(b)}

    def _sync_bindings(self, ch, queue: str) -> None:
        """Bind ``queue`` for every tracked bucket the shard owns, unbind the buckets it
        handed off (consumer thread). Unsharded: nothing to do."""
        if self.sharding is None:
            return
        tracked = self.engine.tracked
        routing = bucket_exchange(self.exchange)
        for bucket in sorted(self._owned_tracked()):
            ch.queue_bind(queue, routing, arguments=bucket_binding(bucket))
        for bucket in sorted(b for b, owner in self.sharding.handoffs.items() if owner != self.sharding.shard):
            ch.queue_unbind(queue, routing, arguments=bucket_binding(bucket))
        self._bound_for = tracked

    def _on_consumer_thread(self, fn, timeout: float = 30.0):
        """Run ``fn(channel)`` on the consumer thread between two batches and return what it
        returns; None when not connected (the next connect does the bindings)."""
        conn, result, done = self._conn, [], threading.Event()
        if conn is None or self._channel is None:
            return None

        def call() -> None:
            try:
                result.append(fn(self._channel))
            except Exception as exc:  # the caller sees it
                result.append(exc)
            done.set()
        try:
            conn.add_callback_threadsafe(call)
        except Exception:  # the connection is closing
            return None
        if not done.wait(timeout):
            return None
        if isinstance(result[0], Exception):
            raise result[0]
        return result[0]

    def request_fence(self, passed) -> bool:
        """Call ``passed()`` (on the consumer thread) once every message the queue holds now
        has been applied; False when no fence can be set (not consuming)."""
        conn = self._conn
        if conn is None or self._channel is None or not self.connected.is_set():
            return False
        number = next(self._fence_ids)
        self._fences[number] = passed

        def publish() -> None:
            try:
                self._channel.basic_publish("", self.queue, b"", pika.BasicProperties(
                    headers={FENCE_HEADER: number}, delivery_mode=1))
            except Exception as exc:  # the connection is going: the caller's wait runs out
                log.debug("fence %d not published: %s", number, exc)
                self._fences.pop(number, None)
        try:
            conn.add_callback_threadsafe(publish)
        except Exception:  # the connection is closing
            self._fences.pop(number, None)
            return False
        return True

    def drop_fence(self, passed) -> None:
        """Forget a fence whose caller stopped waiting."""
        for number, fn in list(self._fences.items()):
            if fn is passed:
                self._fences.pop(number, None)

    def bind(self, buckets) -> None:
        """Bind the shard's queue for ``buckets`` before their first scans begin, so that no
        event of theirs is routed nowhere meanwhile (any thread but the consumer's)."""
        if self.sharding is None or threading.current_thread() is self:
            return
        routing = bucket_exchange(self.exchange)

        def bind_them(ch) -> bool:
            for bucket in buckets:
                ch.queue_bind(self.queue, routing, arguments=bucket_binding(bucket))
            return True
        self._on_consumer_thread(bind_them)

    def release(self, bucket: str, timeout: float = 60.0) -> bool:
        """Unbind ``bucket`` (handed to another shard), then wait until the queue holds no
        event routed here before (the drain). False when not connected or not drained
        within ``timeout`` (its state is forgotten anyway: the new owner scans it)."""
        routing = bucket_exchange(self.exchange)

        def unbind(ch) -> bool:
            ch.queue_unbind(self.queue, routing, arguments=bucket_binding(bucket))
            return True
        if not self._on_consumer_thread(unbind):
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._on_consumer_thread(lambda ch: queue_depth(ch, self.queue) == 0 and not self._in_hand):
                return True
            self._stopping.wait(0.05)
        return False

    def _upgrade_queue(self, conn, why: str) -> None:
        upgrade = self.queue + UPGRADE_SUFFIX
        log.warning("queue %s was declared otherwise (%s): redeclaring it as a %s queue with "
                    "single-active-consumer (events go to %s meanwhile; no message is lost)",
                    self.queue, why, "quorum" if self.quorum else "classic", upgrade)
        ch = conn.channel()
        ch.queue_declare(upgrade, durable=True, arguments={"x-dead-letter-exchange": self.dead})
        self._bind_whole(ch, upgrade, bind=True)
        self._bind_whole(ch, self.queue, bind=False)  # from here on every event is in `upgrade`
        ch.close()
        self._drain_and_delete(conn, self.queue)

    def _finish_upgrade(self, conn) -> None:
        """Apply and delete the temporary queue of an upgrade, if there is one."""
        upgrade = self.queue + UPGRADE_SUFFIX
        ch = conn.channel()
        try:
            ch.queue_declare(upgrade, durable=True, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == NOT_FOUND:
                return
            raise
        self._bind_whole(ch, upgrade, bind=False)  # the queue is declared and bound again
        ch.close()
        self._drain_and_delete(conn, upgrade)
        if not self._stopping.is_set():
            log.warning("queue %s declared anew (%s, single-active-consumer)", self.queue,
                        "quorum" if self.quorum else "classic")

    def _bind_whole(self, ch, queue: str, *, bind: bool) -> None:
        """Bind (or unbind) ``queue`` as the handler's queue is bound: to the exchange, or
        for each bucket of the shard."""
        op = ch.queue_bind if bind else ch.queue_unbind
        if self.sharding is None:
            op(queue, self.exchange)
            return
        declare_bucket_exchange(ch, self.exchange)
        for bucket in sorted(self._owned_tracked()):
            op(queue, bucket_exchange(self.exchange), arguments=bucket_binding(bucket))

    def _drain_and_delete(self, conn, queue: str) -> None:
        """Apply every message of ``queue`` (bound to nothing any more), then delete it."""
        while not self._stopping.is_set():
            ch = conn.channel()
            ch.basic_qos(prefetch_count=self.prefetch)
            self._receive(conn, ch, queue, until_empty=True)
            if self._stopping.is_set():
                return
            try:
                # on the channel that consumed: the messages its cancel handed back are in the
                # queue before the broker looks at whether it is empty
                ch.queue_delete(queue, if_unused=True, if_empty=True)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != PRECONDITION_FAILED:
                    raise
                log.warning("%s not deleted yet (%s): applying what it still holds", queue, exc.reply_text)
                self._stopping.wait(0.5)
                continue
            ch.close()
            log.info("applied and deleted %s", queue)
            return

    def _receive(self, conn, ch, queue: str, until_empty: bool = False) -> None:
        """Consume ``queue`` in batches until stopping or, ``until_empty``, until no message
        is left in it (then the consumer is cancelled)."""
        buf: list = []
        append = buf.append
        tag = ch.basic_consume(queue, lambda _c, m, p, b: append((m.delivery_tag, p, b)))
        if not until_empty:
            self._channel = ch
        while not self._stopping.is_set():
            if self.sharding is not None and self._bound_for is not self.engine.tracked and not until_empty:
                self._sync_bindings(ch, queue)  # buckets tracked since (bind() does it sooner)
            self._in_hand = len(buf)
            conn.process_data_events(time_limit=0.2)
            # take what is already here: keep reading while the socket delivers a backlog (big
            # batches under load), stop at a trickle (waiting for one would add latency)
            deadline = time.monotonic() + 0.02
            while buf and len(buf) < self.max_batch and time.monotonic() < deadline:
                n = len(buf)
                conn.process_data_events(time_limit=0)
                if len(buf) - n < 8:
                    break
            if buf:
                batch = buf[:]
                buf.clear()
                self._handle(ch, batch)
            elif until_empty and queue_depth(ch, queue) == 0:
                break
        if until_empty and not self._stopping.is_set():
            ch.basic_cancel(tag)  # deliveries not yet dispatched go back to the queue
            if buf:
                self._handle(ch, buf[:])

    def _handle(self, ch, batch) -> None:
        """Apply a batch, then reject (dead-letter) the unusable messages and ack the rest
        (eventhandler/batches.py)."""
        tracked = self.engine.tracked
        sharding = self.sharding
        messages = []
        dropped = 0
        fences = []
        for tag, props, body in batch:
            if props.headers and FENCE_HEADER in props.headers:
                fences.append(props.headers[FENCE_HEADER])
                continue
            bucket = message_bucket(props.headers)
            if bucket is not None and bucket not in tracked:
                dropped += 1
                if sharding is not None and not sharding.owns(bucket):
                    sharding.foreign_events += 1  # routed here though another shard owns it
                continue
            if sharding is not None and bucket is not None and not sharding.owns(bucket):
                sharding.foreign_events += 1  # handed off, not released yet: its state goes
                dropped += 1
                continue
            try:
                messages.append(Received(tag, parse_message(body), bucket=bucket, body=body))
            except InvalidEvent as exc:
                messages.append(Received(tag, error=str(exc), bucket=bucket, body=body))
        if dropped:
            self.metrics.dropped.inc(dropped)
        dead = self.applier.apply(messages, received=len(batch))
        invalid = set()
        for m in dead:
            ch.basic_nack(m.tag, multiple=False, requeue=False)
            self.applier.dead_lettered(m, self.dead)
            invalid.add(m.tag)
        if len(invalid) < len(batch):
            ch.basic_ack(batch[-1][0] if batch[-1][0] not in invalid else
                         max(t for t, _, _ in batch if t not in invalid), multiple=True)
        for number in fences:  # (a fence of an earlier connection, or of another handler: none here)
            if isinstance(number, bytes):
                number = number.decode("ascii", "replace")
            passed = self._fences.pop(number, None)
            if passed is not None:
                passed()


class EventPublisher:
    """Publishes MinIO-format messages to the events' exchange the way MinIO does, and counts
    and deletes handler queues: for tests and benchmarks (the handler itself only consumes)."""

    def __init__(self, url: str, exchange: str):
        self.conn = pika.BlockingConnection(pika.URLParameters(url))
        self.ch = self.conn.channel()
        self.exchange = exchange
        declare_exchange(self.ch, exchange)

    def publish(self, body: bytes, headers: dict | None = None) -> None:
        self.ch.basic_publish(self.exchange, "", body, pika.BasicProperties(
            content_type="application/json", delivery_mode=2, headers=headers))

    def queue_count(self, queue: str) -> int:
        return queue_depth(self.ch, queue)

    def delete_queues(self, *queues: str) -> None:
        """Delete handler queues and their dead-letter (and upgrade) queues and exchanges,
        those that exist."""
        for q in queues:
            for op in (lambda: self.ch.queue_delete(q), lambda: self.ch.queue_delete(q + ".dead"),
                       lambda: self.ch.queue_delete(q + UPGRADE_SUFFIX),
                       lambda: self.ch.exchange_delete(q + ".dead")):
                try:
                    if self.ch.is_closed:  # a failed delete closes the channel
                        self.ch = self.conn.channel()
                    op()
                except Exception:
                    pass

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
