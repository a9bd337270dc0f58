"""``delvefs mount`` / ``delvefs umount``: the composition root of the FUSE client.

``run_mount`` checks what it can at once (views file, mountpoint), then, unless
``--foreground``, re-executes itself with ``--foreground`` in a new session, logging to
``<cache-dir>/mount.log`` (or ``--log-file``; rotated, delvefs.shared.logsetup), and waits
on a pipe for one line from the child: ``OK`` once the file system is mounted and
answering, or ``ERR <message>``. Every failure ends with a one-line ``delvefs mount: ...``
error, exit status 1 and nothing left mounted. Settings come as flags or ``-o`` options
(delvefs.client.options, applied by the CLI: the daemon gets them all as flags);
``--read-only`` loads every views file with ``writable: false`` (``_load_views``, also on
reload). Under systemd (``--foreground``, ``Type=notify``) the mount sends ``READY=1``
once it answers and ``STOPPING=1`` when unmounting starts (delvefs.shared.sdnotify).

``serve`` wires the parts inside one AsyncExitStack and one nursery, in this order, and
tears them down in reverse: handler client -> S3 store -> data cache -> core (views
registered with the handler while the buckets are checked) -> FUSE adapter (mounted) ->
tasks (invalidation notifier, view prefetch, signal watcher, the FUSE request loop).

Time to ready is mostly process start, so nothing is done before it that can wait: with
an endpoint and static keys in the environment, the ListObjectsV2 proofs for the handler
are presigned without botocore and each bucket is checked by GETting its proof (an
unreachable store, a missing bucket or refused credentials still fail the mount); the
boto3 client (~0.3 s of CPU for importing boto3 and loading botocore's models) is made in
a worker thread shortly after the mount is ready, or by the first S3 request if that comes
earlier. Otherwise (credentials from a profile or a role) the client is made first, as
the proofs need it.

Proofs (:class:`Proofs`): the handler shows this mount's principal only the views it has
proved it may list in S3 (docs/API.md, "Who sees what"); the proofs go with the
registration (no extra round trip), a background task renews them at half their lifetime
(``DELVEFS_PROOF_LIFETIME``), and a view request the handler answers as if it held none
registers the views again with new ones, then is sent once more.

Write path: dirty files journaled by an earlier (killed) mount of the same cache dir are
recovered and uploaded by the core's background uploader; when the request loop ends
(``umount``, SIGTERM/SIGINT) the daemon uploads everything still dirty before it exits
and writes what it could not upload, and the scratch files left behind, to
``<cache-dir>/unmount-report.txt`` (and the log), which ``delvefs umount`` prints.

``run_umount`` runs ``fusermount3 -u`` and waits for the mount's daemon to exit (its pid
is recorded under ``~/.cache/delvefs/run/``).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("delvefs.client.mount")

READY_FD_ENV = "DELVEFS_READY_FD"
LOG_CAPTURE_ENV = "DELVEFS_LOG_CAPTURE"  # set by _daemonize: stdout/stderr are the log file
# the mount is read-only (--read-only, -o ro): every views file is loaded with writable false
_read_only = False
STATE_DIR = Path(os.environ.get("DELVEFS_STATE_HOME", Path.home() / ".cache" / "delvefs"))
READY_TIMEOUT = float(os.environ.get("DELVEFS_MOUNT_TIMEOUT", "120"))
REPORT = "unmount-report.txt"
# S3 unreachable: a close fails within ~30 s (3 attempts, short connect/read timeouts)
S3_CONNECT_TIMEOUT = float(os.environ.get("DELVEFS_S3_CONNECT_TIMEOUT", "3"))
S3_READ_TIMEOUT = float(os.environ.get("DELVEFS_S3_READ_TIMEOUT", "8"))
S3_ATTEMPTS = int(os.environ.get("DELVEFS_S3_ATTEMPTS", "3"))
# a handler that does not answer (stopped, overloaded) fails an operation after this long
HANDLER_TIMEOUT = float(os.environ.get("DELVEFS_HANDLER_TIMEOUT", "20"))


class MountError(Exception):
    """A one-line, user-facing reason why mounting failed."""


# ----------------------------------------------------------------- helpers

# as rclone and s3fs: a bare K/M/G/T is binary (10G = 10 GiB); KB/MB/GB/TB are decimal
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1024**3, "gb": 1000**3, "gib": 1024**3, "t": 1024**4,
          "tb": 1000**4, "tib": 1024**4}


def parse_cache_size(text: str | None) -> int | None:
    """``10G``/``10GiB`` -> 10*2^30, ``10GB`` -> 10*10^9, ``1000000`` -> bytes."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise MountError(f"--cache-size {text!r}: expected a size such as 500MiB, 10G (= 10GiB), "
                         "10GB (= 10^10 bytes) or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _key(mountpoint: str) -> str:
    return hashlib.sha256(mountpoint.encode()).hexdigest()[:16]


def default_cache_dir(mountpoint: str) -> Path:
    return STATE_DIR / "mounts" / _key(mountpoint)


def run_file(mountpoint: str) -> Path:
    return STATE_DIR / "run" / f"{_key(mountpoint)}.json"


def mounted_fstype(mountpoint: str) -> str | None:
    """The file system type mounted exactly at ``mountpoint``, or None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        parts = line.split(" ")
        sep = parts.index("-")
        point = parts[4].encode().decode("unicode_escape") if "\\" in parts[4] else parts[4]
        if point == mountpoint:
            found = parts[sep + 1]
    return found


def _check_mountpoint(mountpoint: str) -> None:
    if not os.path.isdir(mountpoint):
        raise MountError(f"mountpoint {mountpoint}: not an existing directory")
    if mounted_fstype(mountpoint) is not None or os.path.ismount(mountpoint):
        raise MountError(f"mountpoint {mountpoint} is in use (something is mounted there)")


def _load_views(path: str):
    from rulesets.loader import ViewsError, load_views
    try:
        views = load_views(path)
    except ViewsError as exc:
        raise MountError(f"invalid views file: {'; '.join(str(exc).splitlines())}") from None
    except OSError as exc:
        raise MountError(f"cannot read views file {path}: {exc.strerror}") from None
    if not views:
        raise MountError(f"views file {path} defines no views")
    if _read_only:  # one rule for writes: the views' own (EROFS, 0444/0555), at mount and reload
        import dataclasses
        views = [dataclasses.replace(v, writable=False) for v in views]
    return views


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


# ----------------------------------------------------------------- proofs

def proof_prefixes(views) -> dict[str, list[str]]:
    """``{bucket: [prefix, ...]}``: what this mount must prove it may list — the root of each
    view as the handler computes it from the view's spec (the literal start of its object
    glob, up to the last '/'), without roots below another root of the same bucket."""
    from rulesets.model import default_root
    roots: dict[str, set[str]] = {}
    for v in views:
        roots.setdefault(v.bucket, set()).add(default_root(v.object))
    return {b: sorted(r for r in rs if not any(r != o and r.startswith(o) for o in rs))
            for b, rs in sorted(roots.items())}


class Proofs:
    """This mount's proofs of S3 list rights for the event handler (docs/API.md, "Who sees
    what"): presigned ListObjectsV2 URLs of each bucket and view root, bound to the mount's
    principal, valid ``lifetime`` seconds. The handler lets the principal read the views
    only as long as the URLs it was shown are valid, so :meth:`keep_fresh` presents new
    ones at half their lifetime, and :meth:`reprove` (the handler client's hook) at once
    when the handler answers a view request as if it held none: a restart lost them, or the
    mount slept past their expiry. Signed without botocore when the settings have an
    endpoint and static keys (``client`` None), else with the boto3 ``client``."""

    def __init__(self, views, settings, principal: str, lifetime: int):
        self.prefixes = proof_prefixes(views)
        self.settings, self.principal, self.lifetime = settings, principal, lifetime
        self.client = None
        self.register = None      # async fn(proofs): registers the views with them
        self.signed_at = 0.0      # trio time the proofs the handler holds were signed
        self.renewed_at = float("-inf")
        self._lock = None

    def sign_lean(self) -> dict[str, list[str]] | None:
        """Proofs presigned without botocore (None when the settings need it)."""
        from ..shared import s3
        proofs = {b: [s3.presign_list_url(self.settings, b, prefix=p, principal=self.principal,
                                          expires=self.lifetime) for p in prefixes]
                  for b, prefixes in self.prefixes.items()}
        return None if any(None in urls for urls in proofs.values()) else proofs

    async def sign(self) -> dict[str, list[str]]:
        import trio

        from ..shared import s3
        if self.client is None:
            return self.sign_lean()
        return {b: [await trio.to_thread.run_sync(functools.partial(
                    s3.presigned_list_url, self.client, b, prefix=p, principal=self.principal,
                    expires=self.lifetime)) for p in prefixes]
                for b, prefixes in self.prefixes.items()}

    def presented(self, signed_at: float) -> None:
        """The handler accepted proofs signed at ``signed_at`` (trio time)."""
        import trio
        self.signed_at = signed_at
        self.renewed_at = trio.current_time()

    async def keep_fresh(self, handler) -> None:
        """Present new proofs at half the lifetime of the last ones; after a failure, retry
        soon (the handler's grants last until the old proofs expire)."""
        import trio
        while True:
            await trio.sleep_until(self.signed_at + self.lifetime / 2)
            try:
                async with self._guard():
                    signed_at = trio.current_time()
                    await handler.prove(await self.sign())
                    self.presented(signed_at)
            except Exception as exc:  # noqa: BLE001 — the handler, or signing (credentials); the mount goes on
                log.warning("renewing the proofs of S3 list rights with the event handler: %s", exc)
                await trio.sleep(min(30.0, self.lifetime / 10))

    async def reprove(self) -> None:
        """Register the views again with new proofs, unless another task did since the
        handler's answer that asks for it."""
        import trio
        asked = trio.current_time()
        async with self._guard():
            if self.renewed_at >= asked:
                return
            signed_at = trio.current_time()
            try:
                proofs = await self.sign()
            except Exception as exc:  # noqa: BLE001 — the request's own refusal stands
                log.warning("cannot sign new proofs of S3 list rights: %s", exc)
                return
            await self.register(proofs)
            self.presented(signed_at)
            log.info("presented new proofs to the event handler (it held none valid)")

    def _guard(self):
        import trio
        if self._lock is None:
            self._lock = trio.Lock()
        return self._lock


# ----------------------------------------------------------------- serve

async def serve(views, mountpoint: str, cache_dir: Path, cache_size: int | None,
                handler_url: str, token: str | None, ready, views_path: str | None = None,
                mount_args=None) -> None:
    """Run a mount until it is unmounted or SIGTERM/SIGINT arrives. ``ready()`` is called
    once the kernel mount exists and requests are being answered. ``views_path``: the views
    file, read again by `delvefs reload` and SIGHUP. ``mount_args``: the parsed arguments of
    `delvefs mount` (after ``options.apply``): owner, modes, FUSE options."""
    import trio

    from ..shared import s3
    from ..shared.config import (S3Settings, copy_threshold, handler_principal, proof_lifetime,
                                 upload_concurrency, upload_while_writing)
    from ..shared import sdnotify
    from ..shared.quietgc import QuietGC
    from . import fuse_adapter, options
    from . import journal
    from .datacache import DataCache
    from .fs.core import FileSystem
    from .errors import StoreError
    from .s3async import S3Store
    from .control import ControlServer
    from .reload import ViewsReloader
    from .status import mount_status
    from .handler_api import HandlerClient, HandlerError, HandlerUnavailable

    settings = S3Settings.from_env()
    buckets = sorted({v.bucket for v in views})
    make_client = functools.partial(s3.make_client, settings, retries=S3_ATTEMPTS,
                                    connect_timeout=S3_CONNECT_TIMEOUT, read_timeout=S3_READ_TIMEOUT)
    # with an endpoint and static keys, the proofs are presigned without botocore and the
    # buckets checked with them: boto3 (~0.3 s of CPU) is loaded after the mount is ready
    proof_keeper = Proofs(views, settings, handler_principal(token), proof_lifetime())
    signed_at = trio.current_time()
    proofs = proof_keeper.sign_lean()
    lazy = proofs is not None

    async with contextlib.AsyncExitStack() as stack:
        handler = HandlerClient(handler_url, token, timeout=HANDLER_TIMEOUT)
        stack.push_async_callback(handler.aclose)
        handler.reprove = proof_keeper.reprove
        if lazy:
            # static keys: deletes, HEADs, small PUTs and downloads without botocore (s3.LeanClient)
            lean = s3.LeanClient(settings, attempts=S3_ATTEMPTS, connect_timeout=S3_CONNECT_TIMEOUT,
                                 read_timeout=S3_READ_TIMEOUT)
            store = S3Store(make_client, copy_threshold=copy_threshold(), lean=lean)
        else:
            try:
                store = S3Store(await trio.to_thread.run_sync(make_client),
                                copy_threshold=copy_threshold())
            except Exception as exc:  # noqa: BLE001
                raise MountError(f"S3 client: {exc}") from None
            proof_keeper.client = store.client
            signed_at = trio.current_time()
            proofs = await proof_keeper.sign()
        stack.callback(store.close)
        endpoint = settings.endpoint_url or store.client.meta.endpoint_url

        # the cache dir is this mount's alone (a lock file); journals that earlier mounts of
        # this views file left in other cache dirs (another mount point) are taken over
        try:
            stack.callback(os.close, journal.claim(cache_dir, views_path))
        except BlockingIOError:
            raise MountError(f"cache directory {cache_dir} is in use by another mount") from None
        journal.adopt_orphans(cache_dir, STATE_DIR / "mounts", views_path)
        cache = DataCache(cache_dir, cache_size)
        with contextlib.suppress(FileNotFoundError):
            (cache_dir / REPORT).unlink()
        notifier = fuse_adapter.Notifier()
        from .fs.views_env import core_settings  # TEMPORARY (the settings module replaces it)
        core = FileSystem(views, handler, store, cache, core_settings(mount_args),
                          notifier=notifier, reregister=proof_keeper.reprove)
        stack.callback(core.close)

        errors: dict = {}

        async def check_buckets():
            for bucket in buckets:
                try:
                    # static keys: GET the proof, keeping botocore off the way to ready
                    await store.check_bucket(bucket, proof=proofs[bucket][0] if lazy else None)
                except StoreError as exc:
                    errors.setdefault("s3", f"S3 bucket {bucket} at {endpoint}: {exc}")
                    return

        client_name = f"{socket.gethostname()}:{os.getpid()}:{mountpoint}"
        proof_keeper.register = functools.partial(core.register, client_name)

        async def register():
            try:
                await core.register(client_name, proofs)
                proof_keeper.presented(signed_at)
            except HandlerUnavailable as exc:
                errors["handler"] = f"cannot reach the event handler at {handler_url}: {exc}"
            except HandlerError as exc:
                errors["refused"] = f"the event handler refused the views: {exc}"
        async with trio.open_nursery() as nursery:  # both at once: one round trip each
            nursery.start_soon(check_buckets)
            nursery.start_soon(register)
        for what in ("handler", "s3", "refused"):
            if what in errors:
                raise MountError(errors[what])
        if cache.recovered:
            log.info("%d dirty files in the journal of %s: uploading them", len(cache.recovered), cache_dir)
        core.recover()

        # operations of `delvefs sync/status/reload`, served once the file system is mounted
        control = ControlServer(mountpoint)
        control.handle("ping", functools.partial(_ping, mountpoint, cache_dir))
        control.handle("sync", functools.partial(_sync, core))
        control.handle("status", functools.partial(mount_status, core, mountpoint, cache_dir))
        reloader = ViewsReloader(views_path, core, proof_keeper)  # `delvefs reload`, SIGHUP
        control.handle("reload", reloader.control)

        adapter = fuse_adapter.Adapter(core)
        try:
            fuse_adapter.mount(adapter, mountpoint,
                               fuse_adapter.fuse_options() | options.fuse_options(mount_args))
        except RuntimeError as exc:
            raise MountError(f"cannot mount at {mountpoint}: {exc}") from None
        stack.callback(fuse_adapter.close, True)
        log.info("mounted %d views at %s (cache %s)", len(views), mountpoint, cache_dir)

        async def watch_signals(task_status=trio.TASK_STATUS_IGNORED):
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                task_status.started()
                async for signum in signals:
                    log.info("signal %d: unmounting", signum)
                    fuse_adapter.terminate()
                    return

        async def quiet_gc():
            quiet = QuietGC()
            while True:
                await trio.sleep(1.0)
                quiet.tick()

        async with trio.open_nursery() as nursery:
            cache.nursery = nursery  # where the cache's ranged GETs run
            nursery.start_soon(notifier.run)
            nursery.start_soon(quiet_gc)
            await nursery.start(watch_signals)
            await nursery.start(reloader.watch_hangups)

            async def serve_then_stop():
                await fuse_adapter.serve()
                sdnotify.stopping("uploading dirty files, then exiting")
                # unmounted (or a signal): upload what is dirty before going away
                failed, scratch = await core.shutdown()
                lines = [f"not uploaded (kept in {cache_dir}, uploaded at the next mount "
                         f"of this cache dir): {f}" for f in failed]
                lines += [f"scratch file left behind (never uploaded): {p}" for p in scratch]
                lines += [f"conflict copy left behind (never uploaded): {c}"
                          for c in core.conflict_copies()]
                for line in lines:
                    log.warning("%s", line)
                if lines:
                    (cache_dir / REPORT).write_text("".join(line + "\n" for line in lines))
                nursery.cancel_scope.cancel()
            await nursery.start(core.run_uploads)
            await nursery.start(control.serve)
            nursery.start_soon(serve_then_stop)
            # the request loop now runs: a stat answers, so the mount is ready
            st = await trio.to_thread.run_sync(os.stat, mountpoint)
            fuse_adapter.raise_read_ahead(st.st_dev)  # sequential reads in 1 MiB requests
            nursery.start_soon(core.prefetch)
            ready()
            sdnotify.ready(f"mounted {len(views)} views at {mountpoint}")
            nursery.start_soon(proof_keeper.keep_fresh, handler)
            if lazy:
                nursery.start_soon(_warm, store, cache)
        log.info("unmounted %s", mountpoint)


async def _sync(core, args: dict) -> dict:
    """`delvefs sync`: everything queued reaches S3; the failures, one line each."""
    return {"failed": await core.sync_all()}


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


# ----------------------------------------------------------------- commands

def _setup_logging(args) -> None:
    from ..shared import logsetup
    # the daemon's stdout and stderr are its log file (_daemonize): they follow its rotation
    logsetup.setup(getattr(args, "log_level", None), getattr(args, "log_file", None),
                   debug=getattr(args, "debug", False), capture_std=bool(os.environ.pop(LOG_CAPTURE_ENV, "")))


def _foreground(args, mountpoint: str, cache_dir: Path, cache_size) -> int:
    import trio

    from ..shared.config import handler_token, handler_url

    ready_fd = int(os.environ.pop(READY_FD_ENV, "-1"))

    def tell(line: str) -> None:
        nonlocal ready_fd
        if ready_fd >= 0:
            with contextlib.suppress(OSError):
                os.write(ready_fd, (line + "\n").encode())
                os.close(ready_fd)
            ready_fd = -1

    rf = run_file(mountpoint)

    def ready() -> None:
        rf.parent.mkdir(parents=True, exist_ok=True)
        rf.write_text(json.dumps({"pid": os.getpid(), "mountpoint": mountpoint,
                                  "cache_dir": str(cache_dir)}))
        tell("OK")

    try:
        views = _load_views(args.views)
        trio.run(functools.partial(serve, views_path=os.path.abspath(args.views), mount_args=args),
                 views, mountpoint, cache_dir, cache_size, handler_url(args.handler), handler_token(), ready)
    except MountError as exc:
        tell(f"ERR {exc}")
        print(f"delvefs mount: {exc}", file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: BLE001 — report, then exit non-zero
        if isinstance(exc, KeyboardInterrupt):
            return 0
        log.exception("mount failed")
        tell(f"ERR {type(exc).__name__}: {exc}")
        return 1
    finally:
        with contextlib.suppress(OSError):
            if json.loads(rf.read_text()).get("pid") == os.getpid():
                rf.unlink()
    return 0


def run_mount(args) -> int:
    global _read_only
    from .options import OptionError, check_allow_other
    _read_only = bool(getattr(args, "read_only", False))
    try:
        check_allow_other(args)
        mountpoint = os.path.realpath(args.mountpoint)
        _check_mountpoint(mountpoint)
        # the daemon validates the views (and says what is wrong through the pipe): the
        # parent stays light, so "mount returns when ready" is mostly the daemon's start
        cache_size = parse_cache_size(args.cache_size)
        cache_dir = Path(args.cache_dir).resolve() if args.cache_dir else default_cache_dir(mountpoint)
        cache_dir.mkdir(parents=True, exist_ok=True)
    except (MountError, OptionError) as exc:
        print(f"delvefs mount: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"delvefs mount: cache directory: {exc}", file=sys.stderr)
        return 1
    if args.foreground or getattr(args, "debug", False):
        _setup_logging(args)
        return _foreground(args, mountpoint, cache_dir, cache_size)
    return _daemonize(args, mountpoint, cache_dir)


def _daemonize(args, mountpoint: str, cache_dir: Path) -> int:
    from .options import forward_flags
    log_path = Path(os.path.abspath(args.log_file)) if getattr(args, "log_file", None) else cache_dir / "mount.log"
    cmd = [sys.executable, "-m", "delvefs", "mount", os.path.abspath(args.views), mountpoint,
           "--foreground", "--cache-dir", str(cache_dir)]
    # every setting, -o or flag, as a flag (the config file's variables are in the environment)
    cmd += forward_flags(args, skip=("log_file",)) + ["--log-file", str(log_path)]
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(log_path, "ab")
    except OSError as exc:
        print(f"delvefs mount: log file {log_path}: {exc.strerror}", file=sys.stderr)
        return 1
    r, w = os.pipe()
    env = dict(os.environ, **{READY_FD_ENV: str(w), LOG_CAPTURE_ENV: "1"})
    # a daemon is not the service systemd started (units run `mount --foreground`)
    env.pop("NOTIFY_SOCKET", None)
    with logf:
        proc = subprocess.Popen(cmd, env=env, pass_fds=(w,), stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=logf, start_new_session=True, cwd="/")
    os.close(w)
    line = b""
    deadline = time.monotonic() + READY_TIMEOUT
    import select
    with os.fdopen(r, "rb", buffering=0) as pipe:
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([pipe], [], [], left)[0]:
                break
            chunk = pipe.read(4096)
            if not chunk:
                break
            line += chunk
    text = line.decode(errors="replace").strip()
    if text == "OK":
        return 0
    # failed: make sure nothing stays behind
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if mounted_fstype(mountpoint) is not None:
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)
    if text.startswith("ERR "):
        msg = text[4:]
    elif not text and proc.returncode is not None:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
        msg = f"mount process exited with {proc.returncode}" + (f": {tail[0]}" if tail else "")
    else:
        msg = f"not ready after {READY_TIMEOUT:.0f} s (log: {log_path})"
    print(f"delvefs mount: {msg}", file=sys.stderr)
    return 1


def run_umount(args) -> int:
    mountpoint = os.path.realpath(args.mountpoint)
    fstype = mounted_fstype(mountpoint)
    if fstype is None:
        print(f"delvefs umount: {mountpoint} is not mounted", file=sys.stderr)
        return 1
    if fstype != "fuse.delvefs":
        print(f"delvefs umount: {mountpoint} is a {fstype} mount, not DelveFS", file=sys.stderr)
        return 1
    pid = cache_dir = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        info = json.loads(run_file(mountpoint).read_text())
        pid, cache_dir = info["pid"], info.get("cache_dir")
    report = Path(cache_dir) / REPORT if cache_dir else None
    if report is not None:
        with contextlib.suppress(OSError):
            report.unlink()
    r = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr.strip().splitlines() or [f"fusermount3 exited with {r.returncode}"])[-1]
        print(f"delvefs umount: {msg}", file=sys.stderr)
        return 1
    if pid is not None:
        # the daemon uploads dirty files before it exits: large ones take their time
        deadline = time.monotonic() + float(os.environ.get("DELVEFS_UMOUNT_TIMEOUT", "3600"))
        while _alive(pid):
            if time.monotonic() > deadline:
                print(f"delvefs umount: unmounted, but daemon {pid} still runs", file=sys.stderr)
                return 1
            time.sleep(0.05)
    status = 0
    if report is not None and report.exists():
        for line in report.read_text().splitlines():
            print(f"delvefs umount: {line}", file=sys.stderr)
            if line.startswith("not uploaded"):
                status = 1
    return status


def run_sync(args) -> int:
    """`delvefs sync MOUNT`: wait until every upload and DELETE the mount has queued has
    reached S3; each failure on stderr (``PATH: reason``) and exit status 1."""
    from .control import ControlError, request
    try:
        answer = request(args.mountpoint, "sync", timeout=args.timeout)
    except ControlError as exc:
        print(f"delvefs sync: {exc}", file=sys.stderr)
        return 1
    failed = answer.get("failed") or []
    for line in failed:
        print(f"delvefs sync: not in S3: {line}", file=sys.stderr)
    return 1 if failed else 0
