"""Snapshots of file trees — a local directory, a directory of a mount, a prefix in S3 — as
{relative path: (size, sha256)}, and their differences, named precisely."""
from __future__ import annotations

import hashlib
import os

Entry = tuple[int, str]  # size, sha256 hex


def digest(data: bytes) -> Entry:
    return len(data), hashlib.sha256(data).hexdigest()


def local_tree(root: str) -> tuple[dict[str, Entry], dict[str, str]]:
    """Every file below ``root`` with its size and digest, and every path that could not be
    read with the reason (a mount may fail a read: that is a finding, not a crash)."""
    files: dict[str, Entry] = {}
    unreadable: dict[str, str] = {}
    for here, _dirs, names in os.walk(root, onerror=lambda exc: unreadable.setdefault(
            os.path.relpath(exc.filename or root, root), _reason(exc))):
        for name in names:
            path = os.path.join(here, name)
            rel = os.path.relpath(path, root)
            try:
                with open(path, "rb") as f:
                    files[rel] = digest(f.read())
            except OSError as exc:
                unreadable[rel] = _reason(exc)
    return files, unreadable


def s3_tree(s3, bucket: str, prefix: str) -> tuple[dict[str, Entry], dict[str, str]]:
    """Every object below ``prefix`` (keys relative to it) with its size and digest; a
    listed object whose GET fails is reported, not raised."""
    files: dict[str, Entry] = {}
    unreadable: dict[str, str] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            try:
                body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            except Exception as exc:  # noqa: BLE001 — any failure of one GET is a finding
                unreadable[rel] = f"{type(exc).__name__}: {exc}"
                continue
            files[rel] = digest(body)
            if obj["Size"] != len(body):
                unreadable[rel] = f"listed with {obj['Size']} bytes, GET gave {len(body)}"
    return files, unreadable


def show(entry: Entry | None) -> str:
    return "absent" if entry is None else f"{entry[0]} bytes sha256 {entry[1][:16]}"


def differences(expected: dict[str, Entry], actual: dict[str, Entry], where: str,
                ignore: set[str] = frozenset()) -> list[str]:
    """One line per path whose content in ``actual`` differs from ``expected``."""
    lines = []
    for path in sorted(set(expected) | set(actual)):
        if path in ignore:
            continue
        want, got = expected.get(path), actual.get(path)
        if want != got:
            kind = "missing" if got is None else "extra" if want is None else "differs"
            lines.append(f"{where}: {kind} {path}: expected {show(want)}, got {show(got)}")
    return lines


def _reason(exc: OSError) -> str:
    import errno
    return errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else str(exc)


def differing_ranges(expected: bytes, actual: bytes, limit: int = 4, gap: int = 64) -> str:
    """Where two contents differ: the first ``limit`` byte ranges (end exclusive; ranges
    fewer than ``gap`` equal bytes apart are one: random bytes agree by chance), and what
    the actual bytes there are when they are all zeros."""
    ranges: list[list[int]] = []
    for i in range(max(len(expected), len(actual))):
        same = i < len(expected) and i < len(actual) and expected[i] == actual[i]
        if same:
            continue
        if ranges and i - ranges[-1][1] < gap:
            ranges[-1][1] = i + 1
        else:
            ranges.append([i, i + 1])
    shown = []
    for a, b in ranges[:limit]:
        zeros = actual[a:b] and not actual[a:b].strip(b"\0")
        shown.append(f"{a}-{b}{' (zeros)' if zeros else ''}")
    more = f" and {len(ranges) - limit} more" if len(ranges) > limit else ""
    return f"{len(ranges)} range(s) differ: {', '.join(shown)}{more}"
