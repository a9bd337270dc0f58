"""Compile views once; answer "which views does this object match" in C."""
from __future__ import annotations

import time
from collections.abc import Sequence
from functools import lru_cache

from . import _native
from .expressions import TimeRule, parse_comparison
from .globs import expand_braces, glob_match, is_literal, literal_prefix, literal_suffix, unescape
from .model import ObjectInfo, RuleBlock, View

_TIME_KINDS = {"age": 1, "time": 2}
# native/matcher.h: DFS_FROM_TAGS = 1, DFS_FROM_METADATA = 2; DFS_VALUE_GLOB = 1, DFS_VALUE_NUMBER = 2
_SOURCES = {"properties": 3, "tags": 1, "metadata": 2}
_VALUE_GLOB, _VALUE_NUMBER = 1, 2


def _time_spec(rule: TimeRule | None):
    if rule is None:
        return None
    return (_TIME_KINDS[rule.kind], rule.lo, rule.hi, rule.lo_open, rule.hi_open)


def _value_spec(value: str | None):
    if value is None:
        return None
    comparison = parse_comparison(value)
    if comparison is None:
        return (_VALUE_GLOB, expand_braces(value))
    return (_VALUE_NUMBER, comparison.lo, comparison.lo_open, comparison.hi, comparison.hi_open)


def _block_spec(block: RuleBlock) -> tuple:
    """The tuple native.Matcher compiles for a block (see block_of in native/module.c)."""
    size_lo, size_hi = block.size if block.size is not None else (0, None)
    properties = tuple((key, _SOURCES[rule], tuple(_value_spec(v) for v in values))
                       for rule, key, values in block.property_rules())
    return (None if block.object is None else expand_braces(block.object), size_lo, size_hi,
            _time_spec(block.modified), properties)


def _index_keys(object_glob: str | None) -> tuple[bool, tuple[str, ...]]:
    """(by suffix, keys): the literal prefixes, or suffixes, of the glob's brace alternatives
    (whichever end is longer at its shortest), none an extension of another, so that a key
    starts (ends) with at most one of them and the index finds the view once."""
    if object_glob is None:
        return False, ("",)
    alternatives = expand_braces(object_glob)
    prefixes = [literal_prefix(a, braces=False) for a in alternatives]
    suffixes = [literal_suffix(a, braces=False) for a in alternatives]
    by_suffix = min(map(len, suffixes)) > min(map(len, prefixes))
    kept: list[str] = []
    for key in sorted(set(suffixes if by_suffix else prefixes), key=len):
        if not any((key.endswith(k) if by_suffix else key.startswith(k)) for k in kept):
            kept.append(key)
    return by_suffix, tuple(kept)


def _view_spec(view: View) -> tuple:
    """The tuple native.Matcher compiles (see view_of in native/module.c)."""
    bucket_is_glob = not is_literal(view.bucket)
    bucket = expand_braces(view.bucket) if bucket_is_glob else (unescape(view.bucket),)
    by_suffix, keys = _index_keys(view.object)
    return (bucket_is_glob, bucket, by_suffix, keys, _block_spec(view.rules),
            tuple(_block_spec(block) for block in view.any_of),
            tuple(_block_spec(block) for block in view.none_of))


class Matcher:
    """Compiled views. Indices in answers refer to the `views` list it was built from."""

    def __init__(self, views: Sequence[View]):
        self.views = tuple(views)
        self._native = _native.Matcher([_view_spec(view) for view in self.views])
        self.property_keys = frozenset(key for view in self.views for block in view.blocks
                                       for _, key, _ in block.property_rules())
        # views whose listings carry property values (layout_by): their members' tags and
        # metadata must be known, whatever their rules read
        self.listing_properties = {i: view.layout_by for i, view in enumerate(self.views)
                                   if view.lists_properties}
        # answers per bucket name are cached: the handler asks for every event
        self.names_bucket = lru_cache(maxsize=4096)(self._names_bucket)
        self.needs_tags = lru_cache(maxsize=4096)(self._needs_tags)
        self.needs_metadata = lru_cache(maxsize=4096)(self._needs_metadata)
        self.lists_properties = lru_cache(maxsize=4096)(self._lists_properties)

    def match(self, obj: ObjectInfo, now: float | None = None) -> list[int]:
        """Indices of the views `obj` matches, ascending."""
        return self._native.match(obj, time.time() if now is None else now)

    def match_batch(self, objs: Sequence[ObjectInfo], now: float | None = None) -> list[list[int]]:
        """match() for each object, in one call that releases the GIL while matching."""
        return self._native.match_batch(objs, time.time() if now is None else now)

    def match_partial(self, obj: ObjectInfo, now: float | None = None) -> tuple[list[int], list[int]]:
        """For an object whose tags are not known yet (``obj.tags`` is ignored; its key,
        size, mtime and metadata are used): the views it matches whatever its tags are, and
        the views whose answer may depend on them. Every other view does not match it
        whatever its tags are. Both ascending."""
        return self.match_partial_batch([obj], now)[0]

    def match_partial_batch(self, objs: Sequence[ObjectInfo], now: float | None = None
                            ) -> list[tuple[list[int], list[int]]]:
        """match_partial() for each object, in one call that releases the GIL."""
        return self._native.match_partial_batch(objs, time.time() if now is None else now)

    def tags_could_matter(self, obj: ObjectInfo, now: float | None = None) -> bool:
        """True when match_partial(obj) has undecided views: fetch the object's tags
        before matching it. False: match(obj) with no tags is its answer whatever its tags."""
        return self.tags_could_matter_batch([obj], now)[0]

    def tags_could_matter_batch(self, objs: Sequence[ObjectInfo], now: float | None = None) -> list[bool]:
        """tags_could_matter() for each object, in one call that releases the GIL; cheaper
        than match_partial_batch (no lists, stops at the first undecided view)."""
        return self._native.tags_could_matter_batch(objs, time.time() if now is None else now)

    def next_flip(self, obj: ObjectInfo, now: float | None = None, tags_unknown: bool = False
                  ) -> float | None:
        """Earliest epoch time > now at which match(obj) can change by time alone (relative
        `modified` rules), or None. At that time match() gives the new answer. With
        ``tags_unknown`` (``obj.tags`` is ignored) it is the earliest time at which
        match_partial(obj) can change: when tags may start (or stop) to matter."""
        return self._native.next_flip(obj, time.time() if now is None else now, tags_unknown)

    def _views_on(self, bucket: str):
        return (view for view in self.views if glob_match(view.bucket, bucket))

    def _names_bucket(self, bucket: str) -> bool:
        """True when some view can match objects of `bucket` (bucket rules may be globs)."""
        return any(True for _ in self._views_on(bucket))

    def _needs_tags(self, bucket: str) -> bool:
        """True when tags can change an answer for `bucket`: some view on it has a rule
        that reads tags (`properties` or `tags`, anywhere in the view), or lists property
        values (`layout_by`: the tags of its members are part of its answer)."""
        return any(view.reads_tags or view.lists_properties for view in self._views_on(bucket))

    def _lists_properties(self, bucket: str) -> bool:
        """True when some view on `bucket` lists property values (`layout_by`): its members
        need their tags and metadata known (``in_property_listing`` says which objects)."""
        return any(view.lists_properties for view in self._views_on(bucket))

    def in_property_listing(self, obj: ObjectInfo, now: float | None = None) -> bool:
        """True when `obj`, its tags unknown, is or may be in a view that lists property
        values: its tags and metadata must be known before it is listed there."""
        if not self.listing_properties:
            return False
        definite, undecided = self.match_partial(obj, now)
        listing = self.listing_properties
        return any(i in listing for i in definite) or any(i in listing for i in undecided)

    def listed_property_names(self, indices) -> tuple[str, ...]:
        """The property names the views ``indices`` list (sorted, each once; () for none)."""
        listing = self.listing_properties
        return tuple(sorted({name for i in indices if i in listing for name in listing[i]}))

    def _needs_metadata(self, bucket: str) -> bool:
        """True when user metadata can change an answer for `bucket` (`properties` or
        `metadata` rules)."""
        return any(view.reads_metadata for view in self._views_on(bucket))


def compile_views(views: Sequence[View]) -> Matcher:
    return Matcher(views)
