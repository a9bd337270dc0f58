"""Consuming MinIO's notifications from RabbitMQ (pika; the only module importing pika).
``EventPublisher`` publishes such notifications for tests and benchmarks.

Topology (declared idempotently on every connect):

- exchange ``X`` (default ``delvefs``): fanout, durable — exactly as MinIO declares it (it
  re-declares on each publish; other flags would make one of us fail);
- queue ``Q`` = ``X.handler`` (or $DELVEFS_AMQP_QUEUE): durable, bound to ``X``, so events
  published while the handler is down wait for it; ``x-dead-letter-exchange`` = ``Q.dead``;
- exchange ``Q.dead`` (fanout, durable) and queue ``Q.dead`` bound to it: messages the
  handler cannot use (not JSON, not a MinIO event, an event that fails to apply) are
  rejected without requeue and land there — logged, counted, never redelivered.

One thread (``Consumer``) owns the BlockingConnection and its channel. It collects what is
available (up to ``max_batch`` messages), drops messages of untracked buckets by their
``minio-bucket`` header without decoding them, applies the rest through ``Engine.apply_events``
(one LevelDB WriteBatch), then rejects the invalid ones and acks the batch with one
``multiple=True`` ack. A lost connection is retried with exponential backoff (0.2 s .. 2 s; 5 s to connect);
unacked messages are redelivered by the broker and re-applying them changes nothing.

A LevelDB write that fails (``StorageError``: disk full, I/O error) is not the events' fault:
nothing of that batch is acked or dead-lettered, the consumer closes its connection (the
broker keeps the messages) and reports ``fatal``; the handler then exits non-zero, because
LevelDB may refuse every later write until it is reopened. A restart re-applies the batch.
"""
from __future__ import annotations

import logging
import os
import threading
import time

import pika
import pika.exceptions

from .events import InvalidEvent, message_bucket, parse_message
from .statedb import StorageError

log = logging.getLogger("delvefs.eventhandler.amqp")


def queue_names(exchange: str, queue: str | None = None) -> tuple[str, str]:
    """(handler queue, its dead-letter exchange/queue) for an exchange."""
    queue = queue or os.environ.get("DELVEFS_AMQP_QUEUE") or f"{exchange}.handler"
    return queue, f"{queue}.dead"


def declare_exchange(channel, exchange: str) -> None:
    """The events' exchange, exactly as MinIO declares it."""
    channel.exchange_declare(exchange, exchange_type="fanout", durable=True)


def declare(channel, exchange: str, queue: str, dead: str) -> None:
    declare_exchange(channel, exchange)
    channel.exchange_declare(dead, exchange_type="fanout", durable=True)
    channel.queue_declare(dead, durable=True)
    channel.queue_bind(dead, dead)
    channel.queue_declare(queue, durable=True, arguments={"x-dead-letter-exchange": dead})
    channel.queue_bind(queue, exchange)


def queue_depth(channel, queue: str) -> int:
    """How many messages wait in ``queue`` (which must exist)."""
    return channel.queue_declare(queue, durable=True, passive=True).method.message_count


class LagMonitor(threading.Thread):
    """Samples the queue's depth (messages waiting = lag) on its own connection every
    ``interval`` seconds, so the consumer never waits for that round trip."""

    def __init__(self, url: str, queue: str, gauge, interval: float = 2.0, ready=None):
        super().__init__(name="delvefs-amqp-lag", daemon=True)
        self.url, self.queue, self.gauge, self.interval = url, queue, gauge, interval
        self.ready = ready or (lambda: True)  # the consumer has declared the queue
        self._stopping = threading.Event()

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
                self.gauge.set(queue_depth(ch, self.queue))
            except Exception:  # the broker is away or the queue not declared yet: try later
                if conn is not None and not conn.is_open:
                    conn = None
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except Exception:
                pass


class Consumer(threading.Thread):
    def __init__(self, url: str, exchange: str, engine, metrics, *, queue: str | None = None,
                 prefetch: int = 4000, max_batch: int = 2000, on_fatal=None):
        super().__init__(name="delvefs-amqp", daemon=True)
        self.url = url
        self.exchange = exchange
        self.queue, self.dead = queue_names(exchange, queue)
        self.engine = engine
        self.metrics = metrics
        self.prefetch = prefetch
        self.max_batch = max_batch
        self.state = "connecting"
        self.connected = threading.Event()
        self._stopping = threading.Event()
        self._invalid_logged = 0
        self.last_error: str | None = None
        self.fatal: str | None = None  # why consuming stopped for good (the state cannot be written)
        self._on_fatal = on_fatal or (lambda reason: None)

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
        try:
            ch = conn.channel()
            declare(ch, self.exchange, self.queue, self.dead)
            ch.basic_qos(prefetch_count=self.prefetch)
            buf: list = []
            append = buf.append
            ch.basic_consume(self.queue, lambda _c, m, p, b: append((m.delivery_tag, p, b)))
            self.state = "connected"
            self.connected.set()
            log.info("consuming %s (bound to exchange %s)", self.queue, self.exchange)
            while not self._stopping.is_set():
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
        finally:
            self.connected.clear()
            try:
                if conn.is_open:
                    conn.close()
            except Exception:
                pass

    def _handle(self, ch, batch) -> None:
        tracked = self.engine.tracked
        parsed = []  # (delivery tag, events)
        invalid = []
        dropped = 0
        for tag, props, body in batch:
            bucket = message_bucket(props.headers)
            if bucket is not None and bucket not in tracked:
                dropped += 1
                continue
            try:
                parsed.append((tag, parse_message(body)))
            except InvalidEvent as exc:
                invalid.append(tag)
                self._log_invalid(exc, body)
        if dropped:
            self.metrics.dropped.inc(dropped)
        if parsed:
            events = [e for _, evs in parsed for e in evs]
            try:
                self.engine.apply_events(events)
            except StorageError:
                raise  # the disk, not the events: nothing is acked or dead-lettered
            except Exception:
                log.exception("applying a batch of %d events failed; retrying one by one", len(events))
                for tag, evs in parsed:
                    try:
                        self.engine.apply_events(evs)
                    except StorageError:
                        raise
                    except Exception as exc:
                        invalid.append(tag)
                        self._log_invalid(exc, repr(evs).encode())
        self.metrics.batches.observe(len(batch))
        for tag in invalid:
            ch.basic_nack(tag, multiple=False, requeue=False)
        if invalid:
            self.metrics.dead.inc(len(invalid))
        if len(invalid) < len(batch):
            ch.basic_ack(batch[-1][0] if batch[-1][0] not in invalid else
                         max(t for t, _, _ in batch if t not in invalid), multiple=True)

    def _log_invalid(self, exc, body: bytes) -> None:
        self._invalid_logged += 1
        n = self._invalid_logged
        if n <= 20 or n % 1000 == 0:
            log.warning("dead-lettering an unusable message (#%d): %s; body starts %r",
                        n, exc, bytes(body[:200]))


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
        """Delete handler queues and their dead-letter queues and exchanges, those that exist."""
        for q in queues:
            for op in (lambda: self.ch.queue_delete(q), lambda: self.ch.queue_delete(q + ".dead"),
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
