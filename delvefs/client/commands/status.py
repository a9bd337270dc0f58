"""``delvefs status``: what a mount or the event handler is doing.

- ``delvefs status MOUNT`` asks the mount over its control channel (delvefs/client/mount/control.py,
  operation ``status``, answered inside the mount: delvefs/client/mount/report.py): its daemon's pid
  (and where its pid record is: ``pid_record``, added here), its views, how fresh each is and how many of its keys have no name there (``unshown``: logged once per
  key; docs/SEMANTICS.md), the files not yet in S3 (waiting, pending, uploading, failed, conflict) and
  the cache, and how it writes (eager or not, ``fsync=``).
- ``delvefs status --handler [URL]`` asks the handler (``GET /v1/status`` through
  delvefs/client/handler/api.py, with the principal's token): its event source and lag,
  buckets with the progress of a listing under way, views, work-queue groups (members,
  files in flight, done, failed, backlog; each member), dead letters.

``--json`` prints the answer as it is (one JSON document); otherwise a few short tables.
Exit status 0, or 1 with a one-line error when the mount or handler cannot be asked.
"""
from __future__ import annotations

import json
import sys
import time

from ..mount.control import ControlError, request
from ..mount.mountpoints import run_file
from ..mount.report import STATES

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
                else f"; newest applied event {_age(src['newest_event_age'])} old")]
    store = s.get("store")
    if store is not None:
        if store["reachable"]:
            text = "object store: reachable"
        else:
            text = (f"object store: UNREACHABLE for {_age(store['unreachable_seconds'])}"
                    + (f" ({store['last_error']})" if store.get("last_error") else ""))
        if store["repair_pending"]:
            text += "; a reconcile after its outage is due"
        lines.append(text + f"; {store['repairs']} reconcile(s) after outages")
    lines.append("")
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
    from delvefs.shared.config import handler_token, handler_url, state_home

    try:
        if args.handler is not None:
            from ..handler.api import HandlerError, SyncHandlerClient
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
