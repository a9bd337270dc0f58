"""``delvefs eventhandler``: the composition root.

Wires, inside one ExitStack (torn down in reverse order):

0. the state lock — an exclusive ``flock`` on ``--state-dir`` (eventhandler/standby.py):
   while another handler holds it, this one stands by, answering 503 "standby" on its
   listen address, and takes over (steps 1-4) the moment that one exits or dies;
1. ``Store``   — LevelDB in ``--state-dir`` (the only open of it);
2. ``Engine``  — registered views, buckets, the write lock, S3 worker pools, background
                 threads (tags, time flips, periodic reconcile); it reads S3 through a
                 ``BucketReader`` (delvefs.shared.s3) made here;
3. ``Consumer``— the AMQP thread (pika BlockingConnection), acking after each commit; or,
                 with ``--sqs-queue`` / $DELVEFS_SQS_QUEUE, ``SqsConsumer`` (eventhandler/sqs.py:
                 SQS long polls, deleting after each commit) — one event source per handler;
4. the aiohttp server on the asyncio loop of the main thread, until SIGTERM/SIGINT, with the
   work-queue groups (eventhandler/groups.py, loaded from LevelDB);
   beside it, ``quiet_gc`` keeps garbage collections off the event path (delvefs.shared.quietgc).

If LevelDB cannot be written (disk full, I/O error), by the consumer (which then acks
nothing of its batch) or a background job, the handler stops the same way and exits 3;
events wait in the queue for a restart.

Who may call the API is settled first (eventhandler/auth.py): the principals file
(``--principals``, default ``STATE_DIR/principals.json``) and ``DELVEFS_HANDLER_TOKEN``.
With neither, the API is open, which the handler allows on a loopback address only (or with
``--allow-unauthenticated``, loudly); otherwise it exits 2 before listening. ``--tls-cert``
and ``--tls-key`` serve HTTPS. Grants live in ``STATE_DIR/grants.json`` beside LevelDB.

On a signal: the HTTP server stops, the consumer finishes and acks the batch in hand and
closes its connection, the engine stops its threads, LevelDB is closed; exit 0.

Environment (besides config.py's): ``DELVEFS_RECONCILE_INTERVAL`` (seconds; default 3600,
0 = never; each reconcile also compacts), ``DELVEFS_TOMBSTONE_HORIZON`` (seconds a removed
key's tombstone is kept; default 86400), ``DELVEFS_VIEW_TTL`` (seconds, or ``--view-ttl``: views
no mount used this long are forgotten; default 604800 = 7 days, 0 = never),
``DELVEFS_PUBLISH_TIMEOUT`` (seconds after which the objects of a published directory whose
manifest never came are shown as they are; default 3600, eventhandler/publish.py),
``DELVEFS_AMQP_QUEUE`` (queue name; default ``<exchange>.handler``), ``DELVEFS_LOG_LEVEL``
(default INFO; ``--log-level``, ``--debug`` and ``--log-file`` win); ``DELVEFS_SHARD`` (or
``--shard``: this handler is that shard of the map in ``--shard-map`` / $DELVEFS_HANDLER_URL,
eventhandler/sharding.py), ``DELVEFS_AMQP_QUORUM`` (or ``--quorum-queue``); for the SQS source
``DELVEFS_SQS_POLLERS`` and ``DELVEFS_SQS_VISIBILITY`` (eventhandler/sqs.py);
``DELVEFS_SCAN_LOG_INTERVAL`` (seconds between a listing's progress lines; default 5);
``DELVEFS_STORE_PROBE_INTERVAL`` (seconds between probes of the object store; default 2, 0 =
none) and ``DELVEFS_STORE_SETTLE`` (seconds the store must answer again before the tracked
buckets are reconciled after its outage or restart; default 3; eventhandler/storewatch.py),
``DELVEFS_STORE_EVENTS_WAIT`` (seconds that repair waits at most for the store's events to
flow again; default 30),
``DELVEFS_WAIT_CHECK_AFTER`` (seconds a key a mount waits for may be missing before S3 is
asked for it; default 2). Under systemd
(``Type=notify``) it sends ``READY=1`` once its API answers (active or standing by) and
``STOPPING=1`` when it stops (delvefs.shared.sdnotify).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading

from aiohttp import web

from delvefs.shared import config, logsetup, sdnotify
from delvefs.shared.quietgc import QuietGC, prompt_gil_handoff

log = logging.getLogger("delvefs.eventhandler")

DEFAULT_LISTEN = "127.0.0.1:8731"


def parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return (host.strip("[]") or "127.0.0.1"), int(port)


async def serve(app: web.Application, host: str, port: int, stop: asyncio.Event,
                ssl_context=None, status: str = "active") -> None:
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context)
        await site.start()
        log.info("listening on %s://%s:%d", "https" if ssl_context else "http", host, port)
        # systemd (Type=notify): started once the API answers, be it active or standing by
        sdnotify.ready(f"{status} on {host}:{port}")
        await stop.wait()
    finally:
        await runner.cleanup()


def quiet_gc(stop: threading.Event) -> None:
    quiet = QuietGC()
    while not stop.wait(1.0):
        quiet.tick()


def _sharding(args, shard: str | None, state_dir):
    """This handler's shard of the map (eventhandler/sharding.py), or None for the only
    handler; ValueError for a map that cannot be read."""
    if not shard:
        return None
    from delvefs.shared.shards import ShardMap, ShardMapError

    from .sharding import Sharding
    try:
        sharding = Sharding(shard, ShardMap.parse(config.shard_map_text(
            getattr(args, "shard_map", None))), state_dir)
    except ShardMapError as exc:
        raise ValueError(str(exc)) from None
    log.info("shard %s of %s", shard, sharding.map.text())
    return sharding


def _start_consumer(args, engine, metrics, stop_for, sharding, stack):
    """The started event source, stopped by ``stack``: SQS (AWS S3) or RabbitMQ, with the
    monitor of its queue's depth."""
    sqs_queue = config.sqs_queue(getattr(args, "sqs_queue", None))
    if sqs_queue:  # AWS S3: notifications arrive through SQS (eventhandler/sqs.py)
        from .sqs import SqsConsumer
        consumer = SqsConsumer(sqs_queue, engine, metrics, on_fatal=stop_for, sharding=sharding,
                               dead_letter_url=config.sqs_dead_letter_queue(
                                   getattr(args, "sqs_dead_letter_queue", None)))
        consumer.start()
        stack.callback(consumer.stop)
        return consumer
    from .amqp import Consumer, LagMonitor
    consumer = Consumer(config.amqp_url(args.amqp_url), config.amqp_exchange(args.exchange),
                        engine, metrics, on_fatal=stop_for, sharding=sharding,
                        quorum=config.amqp_quorum(getattr(args, "quorum_queue", False)))
    engine.before_first_scans = consumer.bind
    consumer.start()
    stack.callback(consumer.stop)
    lag = LagMonitor(consumer.url, consumer.queue, metrics.set_queue_depth,
                     ready=consumer.connected.is_set)
    lag.start()
    stack.callback(lag.stop)
    return consumer


def run(args) -> int:
    logsetup.setup(getattr(args, "log_level", None), getattr(args, "log_file", None),
                   debug=getattr(args, "debug", False))
    from delvefs.shared.s3 import BucketReader

    from .api import Api
    from .auth import GRANTS_FILE, Authenticator, Grants, listen_is_loopback, principals_path, tls_context
    from .engine import DEFAULT_VIEW_TTL, Engine
    from .storewatch import DEFAULT_EVENTS_WAIT, DEFAULT_PROBE_INTERVAL, DEFAULT_SETTLE
    from .groups import Groups
    from .metrics import Metrics
    from .publish import DEFAULT_PUBLISH_TIMEOUT
    from .standby import StateLock, stand_by
    from .statedb import Store

    prompt_gil_handoff()  # the API thread must not wait 5 ms for a busy consumer
    state_dir = config.state_dir(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    host, port = parse_listen(args.listen or DEFAULT_LISTEN)
    # who may call the API (eventhandler/auth.py), settled before anything listens
    auth = Authenticator(principals_path(str(state_dir), getattr(args, "principals", None)),
                         config.handler_token())
    if auth.open and not listen_is_loopback(host):
        if not getattr(args, "allow_unauthenticated", False):
            log.error("refusing to serve %s without authentication: issue tokens with `delvefs "
                      "principal add NAME` (file %s) or set DELVEFS_HANDLER_TOKEN; "
                      "--allow-unauthenticated serves it to anyone who can connect", host, auth.path)
            return 2
        log.warning("NO AUTHENTICATION on %s:%d (--allow-unauthenticated): anyone who can connect "
                    "acts as principal 'default' and reads whatever it holds proofs for", host, port)
    try:
        tls = tls_context(getattr(args, "tls_cert", None), getattr(args, "tls_key", None))
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    interval = float(os.environ.get("DELVEFS_RECONCILE_INTERVAL", "3600"))
    horizon = float(os.environ.get("DELVEFS_TOMBSTONE_HORIZON", "86400"))
    view_ttl = getattr(args, "view_ttl", None)
    view_ttl = float(os.environ.get("DELVEFS_VIEW_TTL", DEFAULT_VIEW_TTL)) if view_ttl is None else view_ttl
    publish_timeout = float(os.environ.get("DELVEFS_PUBLISH_TIMEOUT", DEFAULT_PUBLISH_TIMEOUT))
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    with contextlib.ExitStack() as stack:
        stack.callback(loop.close)
        for sig in (signal.SIGTERM, signal.SIGINT):  # before standing by: a standby stops on them too
            loop.add_signal_handler(sig, stop.set)
        # one handler per state directory; another one stands by until this lock is free
        lock = StateLock(state_dir)
        if not lock.acquire_now() and not loop.run_until_complete(
                stand_by(lock, lambda app, until: serve(app, host, port, until, tls, "standing by"), stop)):
            log.info("stopped while standing by")
            return 0
        lock.record_holder(f"{host}:{port}")
        shard = config.handler_shard(getattr(args, "shard", None))
        try:
            sharding = _sharding(args, shard, state_dir)
        except ValueError as exc:
            log.error("%s", exc)
            return 2
        store = Store(str(state_dir / "leveldb"))
        stack.callback(store.close)
        metrics = Metrics(shard=shard or "0")  # ("0": the only handler)
        fatal: list[str] = []  # why the handler must stop (its state cannot be written)

        def stop_for(reason: str) -> None:  # any thread
            fatal.append(reason)
            loop.call_soon_threadsafe(stop.set)
        # tags and metadata without botocore when the keys are static (as a mount's)
        reader = BucketReader.from_settings(config.S3Settings.from_env())
        engine = Engine(store, metrics, reader, reconcile_interval=interval,
                        tombstone_horizon=horizon, view_ttl=view_ttl,
                        publish_timeout=publish_timeout, on_storage_error=stop_for,
                        store_probe_interval=float(os.environ.get("DELVEFS_STORE_PROBE_INTERVAL")
                                                   or DEFAULT_PROBE_INTERVAL),
                        store_settle=float(os.environ.get("DELVEFS_STORE_SETTLE") or DEFAULT_SETTLE),
                        store_events_wait=float(os.environ.get("DELVEFS_STORE_EVENTS_WAIT")
                                                or DEFAULT_EVENTS_WAIT))
        stack.callback(engine.close)
        engine.start()
        consumer = _start_consumer(args, engine, metrics, stop_for, sharding, stack)
        grants = Grants(state_dir / GRANTS_FILE)  # read now: a standby's copy would be stale
        auth.on_revoked = grants.forget
        api = Api(engine, consumer, metrics, auth, grants, config.S3Settings.from_env().endpoint_url,
                  groups=Groups(store), sharding=sharding)  # groups: as LevelDB holds them
        gc_stop = threading.Event()
        threading.Thread(target=quiet_gc, args=(gc_stop,), name="delvefs-gc", daemon=True).start()
        stack.callback(gc_stop.set)
        loop.run_until_complete(serve(api.app(), host, port, stop, tls))
        log.info("stopping")
        sdnotify.stopping()
    if fatal:
        log.error("stopped: %s (no event was lost: the unapplied ones wait in the queue)", fatal[0])
        return 3
    log.info("stopped")
    return 0
