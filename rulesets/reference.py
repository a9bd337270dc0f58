"""Pure-Python reference matcher: the semantics of views, one view at a time.

Slow by design (every view and rule is tested); the compiled matcher in native/matcher.c
must give the same answers, which tests/unit/test_rulesets_native.py checks with random
inputs.

Answers can be partial: with the tags or the relative ages taken as unknown, a rule,
block or view is True, False, or None ("depends on them"), combined as in three-valued
logic (False wins an AND, True wins an OR). A definite answer then holds whatever the
unknowns are; None may be cautious (two rules on the same tag are not correlated).
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

from .expressions import NUMBER, NumberRange, parse_comparison
from .globs import glob_match
from .model import PROPERTY_RULES, ObjectInfo, RuleBlock, View

Truth = bool | None


def bucket_matches(view: View, bucket: str) -> bool:
    return glob_match(view.bucket, bucket)


def number_in_range(comparison: NumberRange, value: str) -> bool:
    if not NUMBER.fullmatch(value):
        return False
    number = Fraction(value)
    if comparison.lo is not None:
        lo = Fraction(comparison.lo)
        if number < lo or (comparison.lo_open and number == lo):
            return False
    if comparison.hi is not None:
        hi = Fraction(comparison.hi)
        if number > hi or (comparison.hi_open and number == hi):
            return False
    return True


_comparison_of = lru_cache(maxsize=4096)(parse_comparison)


def value_matches(accepted: str, value: str) -> bool:
    comparison = _comparison_of(accepted)
    return number_in_range(comparison, value) if comparison is not None else glob_match(accepted, value)


def _all(truths) -> Truth:
    result = True
    for truth in truths:
        if truth is False:
            return False
        if truth is None:
            result = None
    return result


def _any(truths) -> Truth:
    result = False
    for truth in truths:
        if truth is True:
            return True
        if truth is None:
            result = None
    return result


def _negate(truth: Truth) -> Truth:
    return None if truth is None else not truth


def property_rule(rule: str, key: str, accepted: tuple[str | None, ...], obj: ObjectInfo,
                  tags_unknown: bool = False) -> Truth:
    """A `properties`/`tags`/`metadata` rule on one key: some value of the key is accepted,
    or the key is absent and None (absent) is accepted."""
    sources = PROPERTY_RULES[rule]
    known = [source for source in sources if not (tags_unknown and source == "tags")]
    values = [value for source in known for name, value in getattr(obj, source).items()
              if name.lower() == key]
    if any(pattern is not None and value_matches(pattern, value) for pattern in accepted for value in values):
        return True
    if len(known) < len(sources):
        # the tags may add an accepted value, or the key, unless nothing but absence is accepted
        if values and all(pattern is None for pattern in accepted):
            return False
        return None
    return not values and None in accepted


def _block_truths(block: RuleBlock, obj: ObjectInfo, now: float, tags_unknown: bool, ages_unknown: bool):
    if block.size is not None:
        lo, hi = block.size
        yield lo <= obj.size and (hi is None or obj.size <= hi)
    if block.modified is not None:
        rule = block.modified
        if rule.is_relative:
            yield None if ages_unknown else rule.contains(now - obj.mtime)
        else:
            yield rule.contains(obj.mtime)
    if block.object is not None:
        yield glob_match(block.object, obj.key)
    for rule, key, accepted in block.property_rules():
        yield property_rule(rule, key, accepted, obj, tags_unknown)


def block_holds(block: RuleBlock, obj: ObjectInfo, now: float, tags_unknown: bool = False,
                ages_unknown: bool = False) -> Truth:
    return _all(_block_truths(block, obj, now, tags_unknown, ages_unknown))


def _view_truths(view: View, obj: ObjectInfo, now: float, tags_unknown: bool, ages_unknown: bool):
    def holds(block):
        return block_holds(block, obj, now, tags_unknown, ages_unknown)

    yield bucket_matches(view, obj.bucket)
    yield holds(view.rules)
    if view.any_of:
        yield _any(holds(block) for block in view.any_of)
    yield _negate(_any(holds(block) for block in view.none_of))


def view_holds(view: View, obj: ObjectInfo, now: float, tags_unknown: bool = False,
               ages_unknown: bool = False) -> Truth:
    return _all(_view_truths(view, obj, now, tags_unknown, ages_unknown))


def view_matches(view: View, obj: ObjectInfo, now: float) -> bool:
    return view_holds(view, obj, now) is True


def match(views: list[View], obj: ObjectInfo, now: float) -> list[int]:
    return [i for i, view in enumerate(views) if view_matches(view, obj, now)]


def match_partial(views: list[View], obj: ObjectInfo, now: float) -> tuple[list[int], list[int]]:
    """For an object whose tags are unknown (obj.tags is ignored): the views it matches
    whatever its tags are, and the views whose answer may depend on them."""
    truths = [view_holds(view, obj, now, tags_unknown=True) for view in views]
    return ([i for i, truth in enumerate(truths) if truth is True],
            [i for i, truth in enumerate(truths) if truth is None])


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


def next_flip(views: list[View], obj: ObjectInfo, now: float, tags_unknown: bool = False) -> float | None:
    """The earliest time > now at which a relative-age rule changes its answer, among the
    views whose answer depends on their ages and the rules of blocks that are not false
    whatever the ages; None when time alone changes nothing. With ``tags_unknown``
    (obj.tags is ignored), what may hold whatever the tags counts as well."""
    earliest = None
    for view in views:
        if not view.is_time_dependent or \
                view_holds(view, obj, now, tags_unknown, ages_unknown=True) is not None:
            continue
        blocks = [view.rules] + [block for block in view.any_of + view.none_of
                                 if block_holds(block, obj, now, tags_unknown, ages_unknown=True) is not False]
        for block in blocks:
            rule = block.modified
            if rule is None or not rule.is_relative:
                continue
            candidates = []
            if rule.lo is not None:  # becomes true once the age passes lo
                candidates.append(first_time_age_reaches(obj.mtime, rule.lo, strict=rule.lo_open))
            if rule.hi is not None:  # becomes false once the age passes hi
                candidates.append(first_time_age_reaches(obj.mtime, rule.hi, strict=not rule.hi_open))
            for t in candidates:
                if t > now and (earliest is None or t < earliest):
                    earliest = t
    return earliest
