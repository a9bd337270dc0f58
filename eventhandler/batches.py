"""The contract both event sources keep (eventhandler/amqp.py: RabbitMQ; eventhandler/sqs.py:
SQS), written once: a batch of received messages is applied to the state in one LevelDB
WriteBatch (``Engine.apply_events``) and only *then* acknowledged; a message that cannot
be used — not a notification, or its events fail to apply — is dead-lettered: counted
(``delvefs_events_dead_lettered_total``, and its reason kept for ``GET /v1/status``),
logged, never redelivered. A failed LevelDB write (``StorageError``) is not the events'
fault: it propagates, and the source acknowledges and dead-letters nothing of the batch.

Applying is idempotent (per-key sequencers), so a message delivered twice — a redelivery
after a crash, a duplicate from SQS — changes the state once.
"""
from __future__ import annotations

import logging

from .statedb import StorageError

log = logging.getLogger("delvefs.eventhandler.batches")


class Received:
    """One received message: its source's handle (``tag``: an AMQP delivery tag, an SQS
    receipt), its events, or why it cannot be used (``error``)."""

    __slots__ = ("tag", "events", "error", "bucket", "body")

    def __init__(self, tag, events=None, *, error: str | None = None, bucket: str | None = None,
                 body: bytes = b""):
        self.tag = tag
        self.events = events or []
        self.error = error
        self.bucket = bucket or (self.events[0].bucket if self.events else None)
        self.body = body


class BatchApplier:
    def __init__(self, engine, metrics, source: str):
        self.engine = engine
        self.metrics = metrics
        self.source = source
        self._logged = 0

    def apply(self, messages: list[Received], received: int | None = None) -> list[Received]:
        """Apply the events of the usable ``messages`` (one WriteBatch; after a failure, one
        message at a time); returns the messages to dead-letter, their ``error`` set.
        ``received``: the messages of the whole batch (incl. those dropped unread)."""
        dead = [m for m in messages if m.error is not None]
        usable = [m for m in messages if m.error is None and m.events]
        if usable:
            events = [e for m in usable for e in m.events]
            try:
                self._apply(events)
            except StorageError:
                raise  # the disk, not the events: nothing is acknowledged or dead-lettered
            except Exception:
                log.exception("applying a batch of %d events failed; retrying one message at a time",
                              len(events))
                for m in usable:
                    try:
                        self._apply(m.events)
                    except StorageError:
                        raise
                    except Exception as exc:  # noqa: BLE001 — this message's fault: dead-lettered
                        m.error = f"its events failed to apply: {type(exc).__name__}: {exc}"
                        dead.append(m)
        self.metrics.batches.observe(len(messages) if received is None else received)
        return dead

    def _apply(self, events) -> None:
        self.engine.apply_events(events)
        self.metrics.applied(events)

    def dead_lettered(self, m: Received, where: str) -> None:
        """``m`` went to the dead letters (``where`` names them): counted and logged (the
        first 20, then every 1000th)."""
        self.metrics.dead_letters.add(m.error or "unusable", m.bucket)
        self._logged += 1
        n = self._logged
        if n <= 20 or n % 1000 == 0:
            log.warning("dead-lettering an unusable %s message (#%d) to %s: %s; body starts %r",
                        self.source, n, where, m.error, bytes(m.body[:200]))
