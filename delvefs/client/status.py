"""``delvefs status``: what a mount or the event handler is doing.

- ``delvefs status MOUNT`` asks the mount over its control channel (delvefs/client/control.py,
  operation ``status``, answered by :func:`mount_status` inside the mount): its daemon's pid
  (and where its pid record is: ``pid_record``, added here), its views, how fresh each is and how many of its keys have no name there (``unshown``: logged once per
  key; docs/SEMANTICS.md), the files not yet in S3 (waiting, pending, uploading, failed, conflict) and
  the cache, and how it writes (eager or not, ``fsync=``).
- ``delvefs status --handler [URL]`` asks the handler (``GET /v1/status`` through
  delvefs/client/handler_api.py, with the principal's token): its event source and lag,
  buckets with the progress of a listing under way, views, work-queue groups (members,
  files in flight, done, failed, backlog; each member), dead letters.

``--json`` prints the answer as it is (one JSON document); otherwise a few short tables.
Exit status 0, or 1 with a one-line error when the mount or handler cannot be asked.
"""
from __future__ import annotations

import json
import os
import sys
import time

from .control import ControlError, request
from .passthrough import report as passthrough_report
from .mountpoints import run_file

# waiting: closed, in an eager mount's write-back delay (docs/SEMANTICS.md, *Eager mode*);
# pending: to be uploaded as soon as the uploader may
STATES = ("waiting", "pending", "uploading", "failed", "conflict")


# ----------------------------------------------------------------- inside the mount

def views_report(core) -> list[dict]:
    """Each view and how fresh it is (``refreshed_ago``: seconds since its listing was
    last known current; None until listed)."""
    import trio

    now = trio.current_time()
    views = []
    for vs in core.views:
        li = vs.listing
        fresh = None if not li.listed or li.fresh_at == float("-inf") else round(now - li.fresh_at, 3)
        views.append({"name": vs.name, "bucket": vs.bucket, "root": vs.root, "id": li.id,
                      "listed": li.listed, "version": li.version, "ttl": vs.ttl,
                      "refreshed_ago": fresh, "refreshing": li.refreshing is not None,
                      "stale": li.stale, "stale_since": li.stale_since if li.stale is not None else None,
                      "unshown": len(vs.unshown)})
    return views


def upload_counts(report: list[dict]) -> dict[str, int]:
    """How many files (and DELETEs) of ``core.upload_report()`` are in each state."""
    counts = {state: 0 for state in STATES}
    for f in report:
        counts[f["state"]] = counts.get(f["state"], 0) + 1
    return counts


def dirty_bytes(core) -> int:
    """Bytes of the files written through the mount and not in S3 yet."""
    return sum(e.size for e in core.dirty.entries())


async def mount_status(core, mountpoint: str, cache_dir, args: dict) -> dict:
    """The control operation ``status`` (served by the mount: delvefs/client/composition.py)."""
    report = core.upload_report()  # files and deletes not in S3 yet (delvefs/client/fs/uploads.py)
    cache = core.cache
    return {"mountpoint": mountpoint, "pid": os.getpid(), "cache_dir": str(cache_dir),
            "handler": core.handler.base_url, "views": views_report(core),
            "files": report, "counts": upload_counts(report),
            "cache": {"bytes": cache.bytes, "limit": cache.limit, "entries": len(cache.entries),
                      "dirty_bytes": dirty_bytes(core)},
            "passthrough": passthrough_report(core),  # delvefs/client/passthrough.py
            "writes": {"eager": core.eager, "fsync": core.settings.fsync}}


# ----------------------------------------------------------------- the command

def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [header, *rows])


def format_mount(s: dict) -> str:
    record = f", recorded in {s['pid_record']}" if s.get("pid_record") else ""
    lines = [f"mount {s['mountpoint']} (daemon pid {s['pid']}{record}; handler {s['handler']})", ""]
    rows = []
    for v in s["views"]:
        fresh = ("stale: " + v["stale"]) if v["stale"] else (
            "not listed yet" if not v["listed"] else f"refreshed {_age(v['refreshed_ago'])} ago")
        rows.append([v["name"], v["bucket"], f"{v['ttl']:g} s", str(v.get("unshown", 0)), fresh])
    lines.append(_table(rows, ["VIEW", "BUCKET", "TTL", "NOT SHOWN", "FRESHNESS"]))
    c = s["counts"]
    lines += ["", "files not in S3 yet: " + ", ".join(f"{c.get(k, 0)} {k}" for k in STATES)]
    if s["files"]:
        lines.append(_table([[f["path"], f["state"], _size(f["size"]), f.get("error") or ""]
                             for f in s["files"]], ["FILE", "STATE", "SIZE", "ERROR"]))
    cache = s["cache"]
    lines += ["", f"cache: {_size(cache['bytes'])} in {cache['entries']} files "
                  f"(bound {_size(cache['limit']) if cache['limit'] else 'none'}; "
                  f"{_size(cache['dirty_bytes'])} dirty) in {s['cache_dir']}"]
    pt = s.get("passthrough")
    if pt:
        writes = ", writes too" if pt.get("writes") else ""
        lines.append("passthrough: " + (f"on{writes} ({pt['open_files']} files open through it)"
                                        if pt["state"] == "on" else f"off ({pt['reason']})"))
    wr = s.get("writes")
    if wr:
        lines.append("writes: " + (f"eager, fsync={wr['fsync']}" if wr["eager"]
                                   else "close and fsync upload"))
    return "\n".join(lines)


def _listing_text(p: dict) -> str:
    left = f"~{_age(p['eta'])} left of ~{p['expected']}" if p["eta"] is not None else "time left unknown"
    return (f"{p['kind']}: {p['listed']} objects listed in {_age(p['seconds'])} "
            f"({p['rate']:.0f}/s, {left})")


def sharded_status(answers: dict) -> str:
    """One status per shard."""
    return "\n\n".join(f"shard {name}:\n{format_handler(a)}" for name, a in answers.items())


def format_handler(s: dict) -> str:
    src = s["source"]
    lines = [f"handler: principal {s['principal']}, up {_age(s['uptime'])}",
             f"events: {src['kind']} {src['queue']} {src['state']}"
             + (f" ({src['error']})" if src.get("error") else "")
             + f"; {src['messages'] if src['messages'] is not None else '?'} waiting"
             + ("; no event applied yet" if src["newest_event_age"] is None
                else f"; newest applied event {_age(src['newest_event_age'])} old"), ""]
    rows = []
    for name, b in sorted(s["buckets"].items()):
        if "listing" in b:
            detail = _listing_text(b["listing"])
        elif b.get("scanned"):
            detail = f"listed {_age(time.time() - b['scanned'])} ago"
        else:
            detail = ""
        if b.get("scan_error"):
            detail += f" (failing: {b['scan_error']})"
        rows.append([name, b["state"], detail])
    lines.append(_table(rows, ["BUCKET", "STATE", "PROGRESS"]) if rows else "buckets: none you may read")
    lines.append("")
    vrows = [[v["id"], v["bucket"], v["root"] or "/", "ready" if v["ready"] else "building", str(v["clients"])]
             for v in s["views"]]
    lines.append(_table(vrows, ["VIEW ID", "BUCKET", "ROOT", "STATE", "CLIENTS"]) if vrows
                 else "views: none you may read")
    lines += ["", format_groups(s.get("groups", []))]
    dl = s["dead_letters"]
    lines += ["", f"dead letters: {dl['count']}"]
    for d in dl["recent"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d["time"]))
        lines.append(f"  {when} {d['bucket'] or '-'}: {d['reason']}")
    return "\n".join(lines)


def format_groups(groups: list[dict]) -> str:
    """Work-queue groups: members, files in flight, done, failed, backlog; each member (what
    it holds, when it was last heard from, where it runs); the failed files."""
    if not groups:
        return "groups: none you may read"
    rows = [[g["name"], g["view"], str(len(g["members"])), str(g["in_flight"]), str(g["done"]),
             str(g["failed"]), str(g["backlog"])] for g in groups]
    lines = [_table(rows, ["GROUP", "VIEW ID", "MEMBERS", "IN FLIGHT", "DONE", "FAILED", "BACKLOG"])]
    members = [[g["name"], m["id"], str(m["in_flight"]), f"{_age(m['seen_ago'])} ago", m.get("client") or "-"]
               for g in groups for m in g["members"]]
    if members:
        lines += ["", _table(members, ["GROUP", "MEMBER", "IN FLIGHT", "LAST HEARD", "CLIENT"])]
    for g in groups:
        for f in g["failed_files"]:
            lines.append(f"  failed in {g['name']}: {f['key']} after {f['attempts']} attempts"
                         + (f" ({f['error']})" if f.get("error") else ""))
    return "\n".join(lines)


def run(args) -> int:
    """``delvefs status [MOUNT] [--handler [URL]] [--json]``."""
    from ..shared.config import handler_token, handler_url, state_home

    try:
        if args.handler is not None:
            from .handler_api import HandlerError, SyncHandlerClient
            with SyncHandlerClient(handler_url(args.handler or None), handler_token(), timeout=20) as client:
                try:
                    answer = client.status()
                except HandlerError as exc:
                    print(f"delvefs status: {exc}", file=sys.stderr)
                    return 1
            text = sharded_status if client.shards.sharded else format_handler
        elif args.mountpoint:
            answer = request(args.mountpoint, "status", timeout=30)
            answer["pid_record"] = str(run_file(answer["mountpoint"], state_home()))
            text = format_mount
        else:
            print("delvefs status: name a MOUNT, or --handler", file=sys.stderr)
            return 2
    except ControlError as exc:
        print(f"delvefs status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2) if args.json else text(answer))
    return 0
