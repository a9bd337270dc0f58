"""Pure-Python reference matcher: the semantics of views, one view at a time.

Slow by design (every view is tested); the compiled matcher in native/matcher.c must give
the same answers, which tests/unit/test_rulesets_native.py checks with random inputs.
"""
from __future__ import annotations

import math

from .globs import glob_match
from .model import ObjectInfo, TimeRule, View


def bucket_matches(view: View, bucket: str) -> bool:
    return glob_match(view.bucket, bucket)


def _age_base(view_rule_name: str, obj: ObjectInfo) -> float:
    if view_rule_name == "accessed" and obj.atime is not None:
        return obj.atime
    return obj.mtime


def _time_ok(rule: TimeRule | None, base: float, now: float) -> bool:
    if rule is None:
        return True
    return rule.contains(now - base if rule.is_relative else base)


def properties_match(view: View, obj: ObjectInfo) -> bool:
    found: dict[str, list[str]] = {}
    for source in (obj.tags, obj.metadata):
        for key, value in source.items():
            found.setdefault(key.lower(), []).append(value)
    for key, accepted in view.properties.items():
        present = found.get(key)
        if present is None:
            if None not in accepted:
                return False
        elif not any(pattern is not None and glob_match(pattern, value)
                     for pattern in accepted for value in present):
            return False
    return True


def static_match(view: View, obj: ObjectInfo) -> bool:
    """Every rule except relative ages (the part of a view that time cannot change)."""
    if not bucket_matches(view, obj.bucket):
        return False
    if view.object is not None and not glob_match(view.object, obj.key):
        return False
    if view.size is not None:
        lo, hi = view.size
        if obj.size < lo or (hi is not None and obj.size > hi):
            return False
    for name in ("modified", "accessed"):
        rule = getattr(view, name)
        if rule is not None and not rule.is_relative and not rule.contains(_age_base(name, obj)):
            return False
    return properties_match(view, obj)


def view_matches(view: View, obj: ObjectInfo, now: float) -> bool:
    return static_match(view, obj) and all(
        _time_ok(getattr(view, name), _age_base(name, obj), now)
        for name in ("modified", "accessed")
        if getattr(view, name) is not None and getattr(view, name).is_relative)


def match(views: list[View], obj: ObjectInfo, now: float) -> list[int]:
    return [i for i, view in enumerate(views) if view_matches(view, obj, now)]


def first_time_age_reaches(base: float, bound: float, strict: bool) -> float:
    """The earliest float time t with t - base >= bound (> bound when strict), as the
    matcher computes ages; stepping by ulps keeps it exact under rounding."""
    def reached(t: float) -> bool:
        return t - base > bound if strict else t - base >= bound

    t = base + bound
    if reached(t):
        while reached(math.nextafter(t, -math.inf)):
            t = math.nextafter(t, -math.inf)
    else:
        while not reached(t):
            t = math.nextafter(t, math.inf)
    return t


def next_flip(views: list[View], obj: ObjectInfo, now: float) -> float | None:
    """The earliest time > now at which a relative-age rule of a view that otherwise
    matches changes its answer, or None when time alone changes nothing."""
    earliest = None
    for view in views:
        if not view.is_time_dependent or not static_match(view, obj):
            continue
        for name in ("modified", "accessed"):
            rule = getattr(view, name)
            if rule is None or not rule.is_relative:
                continue
            base = _age_base(name, obj)
            candidates = []
            if rule.lo is not None:  # becomes true once the age passes lo
                candidates.append(first_time_age_reaches(base, rule.lo, strict=rule.lo_open))
            if rule.hi is not None:  # becomes false once the age passes hi
                candidates.append(first_time_age_reaches(base, rule.hi, strict=not rule.hi_open))
            for t in candidates:
                if t > now and (earliest is None or t < earliest):
                    earliest = t
    return earliest
