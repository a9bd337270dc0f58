"""The composition root of a mount: :func:`serve` builds every part from the mount's
settings and hands each what it needs through its constructor, inside one AsyncExitStack
and one nursery, in this order, and tears them down in reverse: S3 store -> proofs ->
handler client -> data cache (the cache directory claimed) -> core (views registered with
the handler while the buckets are checked) -> control operations -> metrics exporter
(opt-in: its address bound, its file written) -> FUSE adapter (mounted) -> tasks
(invalidation notifier, uploads, control socket, signal watchers, metrics, the FUSE
request loop, view prefetch, proof renewal).

Time to ready is mostly process start, so nothing is done before it that can wait: with
an endpoint and static keys in the environment, the ListObjectsV2 proofs for the handler
are presigned without botocore and each bucket is checked by GETting its proof (an
unreachable store, a missing bucket or refused credentials still fail the mount); the
boto3 client (~0.3 s of CPU for importing boto3 and loading botocore's models) is made in
a worker thread shortly after the mount is ready, or by the first S3 request if that comes
earlier. Otherwise (credentials from a profile or a role) the client is made first, as
the proofs need it.

Write path: dirty files journaled by an earlier (killed) mount of the same cache dir are
recovered and uploaded by the core's background uploader; when the request loop ends
(``umount``, SIGTERM/SIGINT) the mount uploads everything still dirty before it exits
and writes what it could not upload, and the scratch files left behind, to the cache
directory's unmount report (and the log), which ``delvefs umount`` prints.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import signal
import socket
from pathlib import Path

from .mountpoints import MountError, unmount_report

log = logging.getLogger("delvefs.client.mount")


async def serve(settings, views, ready) -> None:
    """Run the mount of ``views`` that ``settings`` describe until it is unmounted or
    SIGTERM/SIGINT arrives. ``ready()`` is called once the kernel mount exists and requests
    are being answered."""
    import trio

    from delvefs.shared import sdnotify
    from . import fuse_adapter
    from .control import ControlServer, socket_path
    from .fs.core import FileSystem
    from ..handler.api import HandlerClient
    from .metrics import open_exporter, request_times
    from ..handler.proofs import Proofs
    from .reload import ViewsReloader
    from .report import mount_status

    from delvefs.shared.quietgc import prompt_gil_handoff
    prompt_gil_handoff()  # the loop must not wait 5 ms for an upload's thread at each syscall
    mountpoint, cache_dir = settings.mountpoint, settings.cache_dir
    client_name = f"{socket.gethostname()}:{os.getpid()}:{mountpoint}"

    async def register_views(proofs: dict) -> None:  # (the core exists before anyone calls it)
        await core.register(client_name, proofs)

    async with contextlib.AsyncExitStack() as stack:
        store, lean = await _open_store(settings)
        stack.callback(store.close)
        proof_keeper = Proofs(views, settings.s3, settings.handler_principal, settings.proof_lifetime,
                              register=register_views, client=None if lean else store.client)
        signed_at = trio.current_time()
        proofs = await proof_keeper.sign()
        # a view request answered as if this principal held no proof: registered again, with new ones
        handler = HandlerClient(settings.handler_url, settings.handler_token,
                                timeout=settings.handler_timeout, reprove=proof_keeper.reprove)
        stack.push_async_callback(handler.aclose)
        cache = _open_cache(settings, stack)
        notifier = fuse_adapter.Notifier()
        settings = _writes_path(settings)
        core = FileSystem(views, handler, store, cache, settings, notifier=notifier,
                          reregister=proof_keeper.reprove)
        stack.callback(core.close)
        await _check_and_register(settings, views, store, core, client_name, proofs, check_with_proofs=lean)
        proof_keeper.presented(signed_at)
        if cache.recovered:
            log.info("%d dirty files in the journal of %s: uploading them", len(cache.recovered), cache_dir)
        core.recover()

        # `delvefs reload` and SIGHUP; operations of `delvefs sync/status/reload`, served
        # once the file system is mounted
        reloader = ViewsReloader(settings.views_path, core, proof_keeper, read_only=settings.read_only)
        control = ControlServer(socket_path(mountpoint, settings.state_dir), {
            "ping": functools.partial(_ping, mountpoint, cache_dir),
            "sync": functools.partial(_sync, core),
            "status": functools.partial(mount_status, core, mountpoint, cache_dir),
            "reload": reloader.control,
        })

        # Prometheus metrics (opt-in): the address is bound before mounting, so a busy one fails the mount
        requests = request_times() if settings.metrics else None
        exporter = await open_exporter(settings, core, requests)
        if exporter is not None:
            stack.callback(exporter.close)
        adapter = fuse_adapter.Adapter(core, request_times=requests)
        try:
            fuse_adapter.mount(adapter, mountpoint, fuse_adapter.fuse_options() | settings.fuse_options)
        except RuntimeError as exc:
            raise MountError(f"cannot mount at {mountpoint}: {exc}") from None
        stack.callback(fuse_adapter.close, True)
        log.info("mounted %d views at %s (cache %s)", len(views), mountpoint, cache_dir)

        async with trio.open_nursery() as nursery:
            cache.nursery = nursery  # where the cache's ranged GETs run
            nursery.start_soon(notifier.run)
            nursery.start_soon(_quiet_gc)
            await nursery.start(_watch_signals, fuse_adapter.terminate)
            await nursery.start(reloader.watch_hangups)
            if exporter is not None:
                nursery.start_soon(exporter.run)

            async def serve_then_stop():
                await fuse_adapter.serve()
                sdnotify.stopping("uploading dirty files, then exiting")
                await _upload_before_exit(core, cache_dir)
                nursery.cancel_scope.cancel()
            await nursery.start(core.run_uploads)
            await nursery.start(control.serve)
            nursery.start_soon(serve_then_stop)
            # the request loop now runs: a stat answers, so the mount is ready
            st = await trio.to_thread.run_sync(os.stat, mountpoint)
            fuse_adapter.raise_read_ahead(st.st_dev)  # sequential reads in 1 MiB requests
            fuse_adapter.log_killpriv()
            nursery.start_soon(core.prefetch)
            ready()
            sdnotify.ready(f"mounted {len(views)} views at {mountpoint}")
            nursery.start_soon(proof_keeper.keep_fresh, handler)
            if lean:
                nursery.start_soon(_warm, store, cache)
        log.info("unmounted %s", mountpoint)


def _writes_path(settings):
    """An eager mount asked for passthrough writes (``passthrough=rw``) writes through the
    kernel's passthrough instead of its writeback cache; where passthrough cannot be had it
    keeps the writeback cache (the reason logged, and shown by ``delvefs status``)."""
    if settings.eager and settings.passthrough == "rw" and not settings.writeback_cache:
        from .fuse_adapter import passthrough_unavailable  # (pyfuse3: the mount's process only)
        why_not = passthrough_unavailable()
        if why_not:
            log.warning("passthrough writes unavailable (%s): eager mode keeps the kernel's "
                        "writeback cache", why_not)
            return dataclasses.replace(settings, writeback_cache=True)
    return settings


async def _open_store(settings):
    """(the S3 store, whether it is lean): with an endpoint and static keys, small requests
    and downloads go without botocore (s3.LeanClient) and the boto3 client is made when
    first needed; otherwise it is made now (a worker thread)."""
    import trio

    from delvefs.shared import s3
    from .s3async import S3Store
    make_client = functools.partial(s3.make_client, settings.s3, retries=settings.s3_attempts,
                                    connect_timeout=settings.s3_connect_timeout,
                                    read_timeout=settings.s3_read_timeout)
    try:
        lean = s3.LeanClient(settings.s3, attempts=settings.s3_attempts,
                             connect_timeout=settings.s3_connect_timeout,
                             read_timeout=settings.s3_read_timeout)
    except ValueError:  # credentials from a profile or a role: boto3 for everything
        lean = None
    options = {"copy_threshold": settings.copy_threshold,
               "upload_concurrency": settings.upload_concurrency}
    if lean is not None:
        return S3Store(make_client, lean=lean, **options), True
    try:
        client = await trio.to_thread.run_sync(make_client)
    except Exception as exc:  # noqa: BLE001
        raise MountError(f"S3 client: {exc}") from None
    return S3Store(client, **options), False


def _open_cache(settings, stack: contextlib.ExitStack):
    """The data cache of the cache directory, claimed for this mount (a lock file, released
    by ``stack``); journals that earlier mounts of this views file left in other cache
    directories (another mount point) are taken over."""
    from .cache import journal
    from .cache.datacache import DataCache
    cache_dir = settings.cache_dir
    try:
        stack.callback(os.close, journal.claim(cache_dir, settings.views_path))
    except BlockingIOError:
        raise MountError(f"cache directory {cache_dir} is in use by another mount") from None
    journal.adopt_orphans(cache_dir, settings.state_dir / "mounts", settings.views_path)
    cache = DataCache(cache_dir, settings.cache_size)
    with contextlib.suppress(FileNotFoundError):
        unmount_report(cache_dir).unlink()
    return cache


async def _check_and_register(settings, views, store, core, client_name: str, proofs: dict, *,
                              check_with_proofs: bool) -> None:
    """Check every bucket of the views and register the views with the handler with
    ``proofs``, both at once (one round trip each); the first failure, by what matters
    most, as MountError. ``check_with_proofs``: a bucket is checked by GETting its proof
    (static keys: keeping botocore off the way to ready)."""
    import trio

    from .errors import StoreError
    from ..handler.api import HandlerError, HandlerUnavailable
    errors: dict[str, str] = {}
    endpoint = settings.s3.endpoint_url or store.client.meta.endpoint_url

    async def check_buckets():
        for bucket in sorted({v.bucket for v in views}):
            try:
                await store.check_bucket(bucket, proof=proofs[bucket][0] if check_with_proofs else None)
            except StoreError as exc:
                errors.setdefault("s3", f"S3 bucket {bucket} at {endpoint}: {exc}")
                return

    async def register():
        try:
            await core.register(client_name, proofs)
        except HandlerUnavailable as exc:
            errors["handler"] = f"cannot reach the event handler at {settings.handler_url}: {exc}"
        except HandlerError as exc:
            errors["refused"] = f"the event handler refused the views: {exc}"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(check_buckets)
        nursery.start_soon(register)
    for what in ("handler", "s3", "refused"):
        if what in errors:
            raise MountError(errors[what])


async def _upload_before_exit(core, cache_dir: Path) -> None:
    """Unmounted (or a signal): upload what is dirty, and say what could not be."""
    failed, scratch = await core.shutdown()
    lines = [f"not uploaded (kept in {cache_dir}, uploaded at the next mount "
             f"of this cache dir): {f}" for f in failed]
    lines += [f"scratch file left behind (never uploaded): {p}" for p in scratch]
    lines += [f"conflict copy left behind (never uploaded): {c}" for c in core.conflict_copies()]
    for line in lines:
        log.warning("%s", line)
    if lines:
        unmount_report(cache_dir).write_text("".join(line + "\n" for line in lines))


async def _watch_signals(terminate, task_status=None) -> None:
    import trio
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            log.info("signal %d: unmounting", signum)
            terminate()
            return


async def _quiet_gc() -> None:
    import trio

    from delvefs.shared.quietgc import QuietGC
    quiet = QuietGC()
    while True:
        await trio.sleep(1.0)
        quiet.tick()


async def _sync(core, args: dict) -> dict:
    """`delvefs sync`: everything queued reaches S3, then (unless ``wait_handler`` is false)
    the event handler has it; the failures and what the handler lacks, one line each."""
    failed = await core.sync_all()
    unseen = []
    if args.get("wait_handler", True):
        unseen = await core.wait_for_handler(float(args.get("handler_wait", 60.0)))
    return {"failed": failed, "unseen": unseen}


async def _ping(mountpoint: str, cache_dir: Path, args: dict) -> dict:
    return {"pid": os.getpid(), "mountpoint": mountpoint, "cache_dir": str(cache_dir)}


async def _warm(store, cache) -> None:
    """Make the boto3 client (tags, copies, multipart uploads; the lean client does the
    rest) in the background once the mount is ready — after a moment, so that a first
    ``ls`` does not share the GIL with botocore, and not while ranged GETs run
    (building it took 0.2-0.5 s off a first 1 GiB read). An operation that needs it
    earlier makes it itself."""
    import trio
    await trio.sleep(0.5)
    while cache.fetching:
        await trio.sleep(0.25)
    await store.warm()
