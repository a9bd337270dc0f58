"""Size, time and duration expressions, and numeric comparisons of property values."""
from datetime import datetime, timezone
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulesets.expressions import (NumberRange, TimeRule, compare_decimals, decimal_parts, parse_comparison,
                                  parse_duration, parse_size, parse_time)


def utc(*parts) -> float:
    return datetime(*parts, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("text,bounds", [
    (">= 1 MiB", (2**20, None)),
    ("< 100", (0, 99)),
    ("<= 100", (0, 100)),
    ("> 100", (101, None)),
    ("1 KiB .. 4 GiB", (1024, 4 * 2**30)),
    ("1KB..2MB", (1000, 2_000_000)),
    ("2 tb", (2 * 10**12, 2 * 10**12)),
    ("1.5 KiB", (1536, 1536)),
    ("< 0.5 KiB", (0, 511)),
    ("> 0.5 KB", (501, None)),
    ("0.5 KB .. 1.9 KB", (500, 1900)),
    ("12 B", (12, 12)),
    (0, (0, 0)),
    (4096, (4096, 4096)),
])
def test_sizes(text, bounds):
    assert parse_size(text) == bounds


@pytest.mark.parametrize("text,complaint", [
    ("1 XB", "unknown unit 'XB'"),
    ("big", "cannot read 'big'"),
    ("10 .. 5", "empty range"),
    ("< 0", "empty range"),
    ("1.5", "not a whole number"),
    (">=", "incomplete"),
    ("1 ..", "incomplete"),
    ("9000000 TiB", "larger than the largest object size"),
])
def test_bad_sizes_say_what_is_allowed(text, complaint):
    with pytest.raises(ValueError) as caught:
        parse_size(text)
    assert complaint in str(caught.value) and "allowed: " in str(caught.value)


@pytest.mark.parametrize("text,rule", [
    ("< 7d", TimeRule("age", hi=7 * 86400.0, hi_open=True)),
    ("<= 12h", TimeRule("age", hi=12 * 3600.0)),
    ("> 30m", TimeRule("age", lo=1800.0, lo_open=True)),
    (">= 2w", TimeRule("age", lo=14 * 86400.0)),
    ("1d .. 7d", TimeRule("age", lo=86400.0, hi=7 * 86400.0)),
    ("> 90s", TimeRule("age", lo=90.0, lo_open=True)),
    (">= 2026-01-01", TimeRule("time", lo=utc(2026, 1, 1))),
    ("< 2026-01-01", TimeRule("time", hi=utc(2026, 1, 1), hi_open=True)),
    ("<= 2026-01-31", TimeRule("time", hi=utc(2026, 2, 1), hi_open=True)),        # the whole day
    ("> 2026-01-31", TimeRule("time", lo=utc(2026, 2, 1))),
    ("> 2026-01-31T12:00", TimeRule("time", lo=utc(2026, 1, 31, 12), lo_open=True)),
    ("<= 2026-01-31T12:00", TimeRule("time", hi=utc(2026, 1, 31, 12))),
    ("2026-01-01 .. 2026-02-01T12:00", TimeRule("time", lo=utc(2026, 1, 1), hi=utc(2026, 2, 1, 12))),
    ("2026-01-01 .. 2026-01-31", TimeRule("time", lo=utc(2026, 1, 1), hi=utc(2026, 2, 1), hi_open=True)),
    (">= 2026-01-01T08:00+01:00", TimeRule("time", lo=utc(2026, 1, 1, 7))),
])
def test_times(text, rule):
    assert parse_time(text) == rule


@pytest.mark.parametrize("text,complaint", [
    ("7d", "needs a comparison or a range"),
    ("< 7 days", "unknown unit 'days'"),
    ("< 7", "ISO-8601"),
    ("< yesterday", "ISO-8601"),
    ("1d .. 2026-01-01", "both ends"),
    ("7d .. 1d", "empty range"),
    ("2026-02-01 .. 2026-01-01", "empty range"),
])
def test_bad_times_say_what_is_allowed(text, complaint):
    with pytest.raises(ValueError) as caught:
        parse_time(text)
    assert complaint in str(caught.value) and "units s m h d w" in str(caught.value)


def test_time_rules_contain_with_open_and_closed_bounds():
    rule = TimeRule("age", lo=1.0, hi=2.0, lo_open=True)
    assert [rule.contains(x) for x in (1.0, 1.5, 2.0, 2.5)] == [False, True, True, False]


@pytest.mark.parametrize("text,seconds", [("2s", 2.0), ("500ms", 0.5), ("1m", 60.0), ("1h", 3600.0),
                                          ("3", 3.0), (5, 5.0), (0.25, 0.25)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_duration():
    with pytest.raises(ValueError, match="ms, s, m or h"):
        parse_duration("2 days")


@pytest.mark.parametrize("text,comparison", [
    (">= 3", NumberRange(lo="3")),
    (">=3", NumberRange(lo="3")),
    ("> -1.5", NumberRange(lo="-1.5", lo_open=True)),
    ("<= 2e3", NumberRange(hi="2e3")),
    ("< .5", NumberRange(hi=".5", hi_open=True)),
    ("0.5 .. 1", NumberRange(lo="0.5", hi="1")),
    ("1..1", NumberRange(lo="1", hi="1")),
    ("-3 .. -1", NumberRange(lo="-3", hi="-1")),
    # not comparisons: globs
    ("3", None), ("a .. b", None), ("1 .. x", None), ("\\> 2", None), ("=3", None), ("*", None),
])
def test_comparisons(text, comparison):
    assert parse_comparison(text) == comparison


@pytest.mark.parametrize("text,complaint", [
    ("> x", "'> x' starts with '>', but 'x' is not a number"),
    ("<", "incomplete comparison"),
    (">= 1 KiB", "but '1 KiB' is not a number"),
    ("2 .. 1", "matches no value (empty range)"),
    ("> 1e10000", "exponent of '1e10000' in '> 1e10000' is too large"),
])
def test_bad_comparisons_say_what_is_allowed_and_how_to_write_a_literal(text, complaint):
    with pytest.raises(ValueError) as caught:
        parse_comparison(text)
    assert complaint in str(caught.value) and "written with a backslash: '\\> 2'" in str(caught.value)


def test_comparisons_accept_numbers_only_and_exactly():
    lane = parse_comparison(">= 3")
    assert [lane.accepts(v) for v in ("3", "3.0", "+3", "30e-1", "2.999", "10", "x", "3 ", "", "inf", "٣")] == [
        True, True, True, True, False, True, False, False, False, False, False]
    score = parse_comparison("0.5 .. 1")
    assert [score.accepts(v) for v in ("0.5", ".5", "1", "1.0000000000000000001", "0.4999", "-0.7")] == [
        True, True, True, False, False, False]
    assert parse_comparison("< 0").accepts("-0.0001") and not parse_comparison("< 0").accepts("-0")
    assert [parse_comparison(t).text for t in (">=3", "<1", " 1..2 ")] == [">= 3", "< 1", "1 .. 2"]


@settings(max_examples=300, deadline=None)
@given(st.decimals(allow_nan=False, allow_infinity=False, places=None).map(str),
       st.decimals(allow_nan=False, allow_infinity=False).map(str))
def test_decimal_order_is_the_exact_order(a, b):
    parts_a, parts_b = decimal_parts(a), decimal_parts(b)
    if parts_a is None or parts_b is None:   # "1E+2" style is a number; "-Infinity" is not drawn
        return
    x, y = Fraction(a), Fraction(b)
    assert compare_decimals(parts_a, parts_b) == (x > y) - (x < y)
    assert decimal_parts(str(x.numerator)) == decimal_parts(a) or x.denominator != 1
