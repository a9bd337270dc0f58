"""Compile views once; answer "which views does this object match" in C."""
from __future__ import annotations

import time
from collections.abc import Sequence
from functools import lru_cache

from . import _native
from .globs import glob_match, is_literal, literal_prefix, literal_suffix, unescape
from .model import ObjectInfo, TimeRule, View

_TIME_KINDS = {"age": 1, "time": 2}


def _time_spec(rule: TimeRule | None):
    if rule is None:
        return None
    return (_TIME_KINDS[rule.kind], rule.lo, rule.hi, rule.lo_open, rule.hi_open)


def _view_spec(view: View) -> tuple:
    """The tuple native.Matcher compiles (see view_of in native/module.c)."""
    bucket_is_glob = not is_literal(view.bucket)
    bucket = view.bucket if bucket_is_glob else unescape(view.bucket)
    prefix = literal_prefix(view.object) if view.object is not None else ""
    suffix = literal_suffix(view.object) if view.object is not None else ""
    size_lo, size_hi = view.size if view.size is not None else (0, None)
    properties = tuple((key, tuple(values)) for key, values in view.properties.items())
    return (bucket, bucket_is_glob, view.object, prefix, suffix, size_lo, size_hi,
            _time_spec(view.modified), _time_spec(view.accessed), properties)


class Matcher:
    """Compiled views. Indices in answers refer to the `views` list it was built from."""

    def __init__(self, views: Sequence[View]):
        self.views = tuple(views)
        self._native = _native.Matcher([_view_spec(view) for view in self.views])
        self.property_keys = frozenset(key for view in self.views for key in view.properties)
        # answers per bucket name are cached: the handler asks for every event
        self.names_bucket = lru_cache(maxsize=4096)(self._names_bucket)
        self.needs_tags = lru_cache(maxsize=4096)(self._needs_tags)

    def match(self, obj: ObjectInfo, now: float | None = None) -> list[int]:
        """Indices of the views `obj` matches, ascending."""
        return self._native.match(obj, time.time() if now is None else now)

    def match_batch(self, objs: Sequence[ObjectInfo], now: float | None = None) -> list[list[int]]:
        """match() for each object, in one call that releases the GIL while matching."""
        return self._native.match_batch(objs, time.time() if now is None else now)

    def next_flip(self, obj: ObjectInfo, now: float | None = None) -> float | None:
        """Earliest epoch time > now at which match(obj) can change by time alone (relative
        `modified`/`accessed` rules), or None. At that time match() gives the new answer."""
        return self._native.next_flip(obj, time.time() if now is None else now)

    def _views_on(self, bucket: str):
        return (view for view in self.views if glob_match(view.bucket, bucket))

    def _names_bucket(self, bucket: str) -> bool:
        """True when some view can match objects of `bucket` (bucket rules may be globs)."""
        return any(True for _ in self._views_on(bucket))

    def _needs_tags(self, bucket: str) -> bool:
        """True when tags can change an answer for `bucket`: some view on it has properties."""
        return any(view.properties for view in self._views_on(bucket))


def compile_views(views: Sequence[View]) -> Matcher:
    return Matcher(views)
