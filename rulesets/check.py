"""`delvefs check VIEWS.yaml [--objects OBJECTS.jsonl]`: validate a views file, and
optionally print which views each listed object belongs to (one JSON line per object).
An object's `atime` is accepted and ignored (no rule reads it)."""
from __future__ import annotations

import difflib
import json
import sys
import time
from datetime import datetime, timezone

from .expressions import TimeRule, parse_comparison
from .loader import ViewsError, load_views
from .matcher import compile_views
from .model import ObjectInfo, RuleBlock, View

OBJECT_FIELDS = ("bucket", "key", "size", "mtime", "atime", "tags", "metadata")
_META_PREFIX = "x-amz-meta-"
_BATCH = 1000


def _bound(value: float, kind: str) -> str:
    if kind == "age":
        for unit, seconds in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
            if value >= seconds and value % seconds == 0:
                return f"{value / seconds:g}{unit}"
        return f"{value:g}s"
    return datetime.fromtimestamp(value, timezone.utc).isoformat().replace("+00:00", "Z")


def _describe_time(rule: TimeRule) -> str:
    what = "age" if rule.kind == "age" else "time"
    parts = []
    if rule.lo is not None:
        parts.append(f"{what} {'>' if rule.lo_open else '>='} {_bound(rule.lo, rule.kind)}")
    if rule.hi is not None:
        parts.append(f"{what} {'<' if rule.hi_open else '<='} {_bound(rule.hi, rule.kind)}")
    return " and ".join(parts)


_PROPERTY_PREFIX = {"properties": "", "tags": "tag ", "metadata": "metadata "}


def _describe_rules(block: RuleBlock) -> list[str]:
    rules = []
    if block.object is not None:
        rules.append(f"object {block.object}")
    if block.size is not None:
        lo, hi = block.size
        rules.append(f"size >= {lo} B" if hi is None else f"size {lo} .. {hi} B")
    if block.modified is not None:
        rules.append(f"modified {_describe_time(block.modified)}")
    for rule, key, values in block.property_rules():
        shown = ["(absent)" if v is None else v for v in values]
        name = _PROPERTY_PREFIX[rule] + key
        if len(shown) > 1:
            rules.append(f"{name} in [{', '.join(shown)}]")
        else:   # a comparison reads as one: "lane >= 3"
            rules.append(f"{name} {'' if values[0] and parse_comparison(values[0]) else '= '}{shown[0]}")
    return rules


def describe(view: View) -> str:
    """One line: what the view selects and how it is shown."""
    rules = [f"bucket {view.bucket}"] + _describe_rules(view.rules)
    for what, blocks in (("any of", view.any_of), ("none of", view.none_of)):
        if blocks:
            rules.append(f"{what} " + " | ".join(f"({', '.join(_describe_rules(b))})" for b in blocks))
    layout = view.layout if view.layout_by is None else "by " + ", ".join(view.layout_by)
    options = [layout, f"root '{view.root}'", f"ttl {view.ttl:g}s",
               "writable" if view.writable else "read-only"]
    if view.set:
        options.append("set " + ", ".join(f"{k}={v}" for k, v in view.set.items()))
    return f"{view.name}: {'; '.join(rules)} ({', '.join(options)})"


def _time(value, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"`{field}` must be epoch seconds or an ISO-8601 date-time")
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"`{field}` {value!r} is not an ISO-8601 date-time "
                             "(like 2026-01-31T12:00:00Z) or epoch seconds") from None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=timezone.utc)
        return stamp.timestamp()
    return float(value)


def _text(value, what: str) -> str:
    """Tag values as text: JSON numbers and booleans read as a user would write them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"{what} must be text, a number or a boolean, not {json.dumps(value)}")


def _properties(value, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"`{field}` must be an object of names to values")
    result = {}
    for key, item in value.items():
        if field == "metadata" and key.lower().startswith(_META_PREFIX):
            key = key[len(_META_PREFIX):]
        result[key] = _text(item, f"`{field}` {key!r}")
    return result


def parse_object(line: str) -> ObjectInfo:
    """One line of an objects file; ValueError says what is wrong."""
    try:
        record = json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(record, dict):
        raise ValueError("each line must be a JSON object with bucket, key, size and mtime")
    for field in record:
        if field not in OBJECT_FIELDS:
            close = difflib.get_close_matches(field, OBJECT_FIELDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"unknown field {field!r}; {hint}allowed: {', '.join(OBJECT_FIELDS)}")
    missing = [f for f in ("bucket", "key", "size", "mtime") if f not in record]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}; each object needs bucket, key, size and mtime")
    for field in ("bucket", "key"):
        if not isinstance(record[field], str):
            raise ValueError(f"`{field}` must be a string")
    size = record["size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError("`size` must be a whole number of bytes >= 0")
    atime = record.get("atime")
    return ObjectInfo(
        bucket=record["bucket"], key=record["key"], size=size,
        mtime=_time(record["mtime"], "mtime"),
        atime=None if atime is None else _time(atime, "atime"),
        tags=_properties(record.get("tags"), "tags"),
        metadata=_properties(record.get("metadata"), "metadata"),
    )


def read_objects(path: str) -> list[ObjectInfo]:
    """All objects of a JSON-lines file; blank lines are skipped. ValueError lists every bad line."""
    objects, errors = [], []
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    objects.append(parse_object(line))
                except ValueError as exc:
                    errors.append(f"{path}:{number}: {exc}")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the objects file: {exc}") from None
    if errors:
        raise ValueError("\n".join(errors))
    return objects


def run(args) -> int:
    try:
        views = load_views(args.views)
    except ViewsError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.objects is None:
        for view in views:
            print(describe(view))
        print(f"{args.views}: {len(views)} view{'s' if len(views) != 1 else ''}, valid")
        return 0
    try:
        objects = read_objects(args.objects)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    matcher = compile_views(views)
    now = time.time()
    for start in range(0, len(objects), _BATCH):
        batch = objects[start:start + _BATCH]
        for obj, matched in zip(batch, matcher.match_batch(batch, now)):
            names = sorted(views[i].name for i in matched)
            print(json.dumps({"bucket": obj.bucket, "key": obj.key, "views": names}, ensure_ascii=False))
    return 0
