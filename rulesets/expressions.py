"""The small expression languages in rules: sizes, times, durations and numeric
comparisons of property values; their parsers and what times and comparisons denote
(TimeRule, NumberRange).

Each parser raises ValueError with a message that says what is wrong and what is allowed.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from fractions import Fraction

MAX_SIZE = 2**63 - 1

SIZE_UNITS = {
    "b": 1,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
SIZE_ALLOWED = ('allowed: "< N", "<= N", "> N", ">= N", "N .. M" (inclusive) or "N" (exactly), '
                "where N is bytes or a number with a unit B, KiB, MiB, GiB, TiB, KB, MB, GB, TB")

AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
TIME_ALLOWED = ('allowed: an age "< 7d", "<= 12h", "> 30m", ">= 2w", "1d .. 7d" (units s m h d w), '
                'or ISO-8601 dates/times "2026-01-01 .. 2026-02-01T12:00", ">= 2026-01-01", '
                '"< 2026-03-01T08:00:00+01:00"')

DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
DURATION_ALLOWED = 'allowed: a number with a unit ms, s, m or h, like "500ms", "2s", "1m", or plain seconds'

_OPERATORS = ("<=", ">=", "<", ">")
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]*)\s*$")


def _split(text: str) -> tuple[str | None, str, str | None]:
    """Split "OP X", "X .. Y" or "X" into (operator, x, y)."""
    text = text.strip()
    for op in _OPERATORS:
        if text.startswith(op):
            return op, text[len(op):].strip(), None
    if ".." in text:
        lo, _, hi = text.partition("..")
        return "..", lo.strip(), hi.strip()
    return None, text, None


def _number_with_unit(text: str, units: dict, default_unit: str | None, allowed: str) -> Fraction:
    match = _NUMBER_UNIT.match(text)
    if not match:
        raise ValueError(f"cannot read {text!r} as a number with a unit; {allowed}")
    number, unit = match.groups()
    if not unit:
        if default_unit is None:
            raise ValueError(f"{text!r} needs a unit; {allowed}")
        unit = default_unit
    factor = units.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown unit {unit!r} in {text!r}; {allowed}")
    return Fraction(number) * Fraction(factor)


def parse_size(value: str | int) -> tuple[int, int | None]:
    """A size rule as inclusive byte bounds (lo, hi); hi None is unbounded."""
    if isinstance(value, int):
        value = str(value)
    op, a, b = _split(value)
    if not a or (op == ".." and not b):
        raise ValueError(f"incomplete size expression {value!r}; {SIZE_ALLOWED}")
    x = _number_with_unit(a, SIZE_UNITS, "b", SIZE_ALLOWED)
    if op == "<":
        lo, hi = 0, math.ceil(x) - 1
    elif op == "<=":
        lo, hi = 0, math.floor(x)
    elif op == ">":
        lo, hi = math.floor(x) + 1, None
    elif op == ">=":
        lo, hi = math.ceil(x), None
    elif op == "..":
        lo, hi = math.ceil(x), math.floor(_number_with_unit(b, SIZE_UNITS, "b", SIZE_ALLOWED))
    else:
        if x.denominator != 1:
            raise ValueError(f"{value!r} is not a whole number of bytes; {SIZE_ALLOWED}")
        lo = hi = int(x)
    if lo > MAX_SIZE or (hi is not None and hi > MAX_SIZE):
        raise ValueError(f"size {value!r} is larger than the largest object size; allowed: at most 2^63-1 bytes")
    if hi is not None and lo > hi:
        raise ValueError(f"size {value!r} matches no object (empty range); {SIZE_ALLOWED}")
    return lo, hi


@dataclass(frozen=True)
class TimeRule:
    """A `modified` rule: an interval over an age (``kind="age"``, seconds
    before now) or over a time stamp (``kind="time"``, epoch seconds). ``lo``/``hi`` of
    None are unbounded; ``lo_open``/``hi_open`` make a bound exclusive."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    @property
    def is_relative(self) -> bool:
        return self.kind == "age"

    def contains(self, value: float) -> bool:
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        if self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi):
            return False
        return True

    def spec(self) -> dict:
        return {"kind": self.kind, "lo": self.lo, "hi": self.hi,
                "lo_open": self.lo_open, "hi_open": self.hi_open}

    @classmethod
    def from_spec(cls, spec: dict) -> "TimeRule":
        unknown = sorted(set(spec) - {"kind", "lo", "hi", "lo_open", "hi_open"})
        if unknown:
            raise ValueError(f"unknown time rule keys {unknown}; allowed: kind, lo, hi, lo_open, hi_open")
        if spec.get("kind") not in ("age", "time"):
            raise ValueError(f"time rule kind must be 'age' or 'time', not {spec.get('kind')!r}")
        bounds = [spec.get("lo"), spec.get("hi")]
        for i, value in enumerate(bounds):
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                    raise ValueError("time rule bounds must be numbers or null")
                bounds[i] = float(value)
        flags = [spec.get("lo_open", False), spec.get("hi_open", False)]
        if not all(isinstance(flag, bool) for flag in flags):
            raise ValueError("lo_open and hi_open must be true or false")
        return cls(spec["kind"], bounds[0], bounds[1], flags[0], flags[1])


def _age(text: str) -> float:
    return float(_number_with_unit(text, AGE_UNITS, None, TIME_ALLOWED))


def _instant(text: str) -> tuple[float, float]:
    """An ISO-8601 date or date-time as the interval [start, end) it denotes: a date is
    the whole day, a date-time one instant. Without a UTC offset, UTC is meant."""
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"cannot read {text!r} as an ISO-8601 date or date-time; {TIME_ALLOWED}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    start = stamp.timestamp()
    is_date_only = re.fullmatch(r"\d{4}-?\d{2}-?\d{2}", text) is not None
    end = (stamp + timedelta(days=1)).timestamp() if is_date_only else start
    return start, end


def parse_time(text: str) -> TimeRule:
    """A `modified`/`accessed` rule: relative age or ISO-8601 range."""
    op, a, b = _split(str(text))
    if op is None:
        raise ValueError(f"{text!r} needs a comparison or a range; {TIME_ALLOWED}")
    if not a or (op == ".." and not b):
        raise ValueError(f"incomplete time expression {text!r}; {TIME_ALLOWED}")
    is_age = _NUMBER_UNIT.match(a) is not None
    if is_age:
        x = _age(a)
        rule = {
            "<": TimeRule("age", hi=x, hi_open=True),
            "<=": TimeRule("age", hi=x),
            ">": TimeRule("age", lo=x, lo_open=True),
            ">=": TimeRule("age", lo=x),
        }.get(op)
        if op == "..":
            if _NUMBER_UNIT.match(b) is None:
                raise ValueError(f"both ends of {text!r} must be ages (like 1d) or both dates; {TIME_ALLOWED}")
            rule = TimeRule("age", lo=x, hi=_age(b))
    else:
        start, end = _instant(a)
        # A date stands for its whole day: "<= 2026-01-31" includes that day's last second.
        rule = {
            "<": TimeRule("time", hi=start, hi_open=True),
            "<=": TimeRule("time", hi=end, hi_open=end != start),
            ">": TimeRule("time", lo=end, lo_open=end == start),
            ">=": TimeRule("time", lo=start),
        }.get(op)
        if op == "..":
            if _NUMBER_UNIT.match(b) is not None:
                raise ValueError(f"both ends of {text!r} must be ages (like 1d) or both dates; {TIME_ALLOWED}")
            end_start, end_end = _instant(b)
            rule = TimeRule("time", lo=start, hi=end_end, hi_open=end_end != end_start)
    if rule.lo is not None and rule.hi is not None and (
            rule.lo > rule.hi or (rule.lo == rule.hi and (rule.lo_open or rule.hi_open))):
        raise ValueError(f"{text!r} matches nothing (empty range); {TIME_ALLOWED}")
    return rule


def parse_duration(value: str | int | float) -> float:
    """A `ttl`: seconds as a float."""
    if isinstance(value, (int, float)):
        seconds = Fraction(value)
    else:
        seconds = _number_with_unit(str(value), DURATION_UNITS, "s", DURATION_ALLOWED)
    return float(seconds)


# ---- numeric comparisons of property values ----

COMPARISON_ALLOWED = ('allowed: "< N", "<= N", "> N", ">= N" or "N .. M" (both included), where N and '
                      'M are decimal numbers like 3, -1.5 or 2e3; a value meant literally that starts '
                      'with < or > is written with a backslash: \'\\> 2\'')
# What a property value must look like to be a number (the C matcher reads the same).
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# Bounds keep their exponents small so that the C matcher, which saturates huge exponents
# of values, orders every value against them exactly.
_MAX_BOUND_EXPONENT_DIGITS = 4


def decimal_parts(text: str) -> tuple[int, int, str] | None:
    """A number as (sign, exponent, digits) with text == sign * 0.digits * 10**exponent
    exactly, digits without leading or trailing zeros (zero is (0, 0, "")); None when
    `text` is not a number (see NUMBER: no spaces, no inf or nan)."""
    if not NUMBER.fullmatch(text):
        return None
    sign = -1 if text[0] == "-" else 1
    mantissa, _, exponent = text.lstrip("+-").lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    significant = digits.lstrip("0")
    if not significant:
        return 0, 0, ""
    return sign, len(whole) - (len(digits) - len(significant)) + int(exponent or 0), significant.rstrip("0")


def compare_decimals(a: tuple[int, int, str], b: tuple[int, int, str]) -> int:
    """-1, 0 or 1 as the number `a` is below, equal to or above `b` (decimal_parts)."""
    if a[0] != b[0]:
        return -1 if a[0] < b[0] else 1
    if a[0] == 0:
        return 0
    # equal signs: order the magnitudes, then flip for negative numbers
    if a[1] != b[1]:
        magnitude = -1 if a[1] < b[1] else 1
    else:
        magnitude = (a[2] > b[2]) - (a[2] < b[2])
    return magnitude * a[0]


@dataclass(frozen=True)
class NumberRange:
    """A numeric comparison of a property value; None bounds are unbounded. ``lo``/``hi``
    keep the numbers as written."""

    lo: str | None = None
    hi: str | None = None
    lo_open: bool = False
    hi_open: bool = False

    def accepts(self, value: str) -> bool:
        """True when `value` is a number within the range (a value that is not a number never is)."""
        number = decimal_parts(value)
        if number is None:
            return False
        if self.lo is not None:
            order = compare_decimals(number, decimal_parts(self.lo))
            if order < 0 or (order == 0 and self.lo_open):
                return False
        if self.hi is not None:
            order = compare_decimals(number, decimal_parts(self.hi))
            if order > 0 or (order == 0 and self.hi_open):
                return False
        return True

    @property
    def text(self) -> str:
        """The canonical way to write it."""
        if self.lo is not None and self.hi is not None:
            return f"{self.lo} .. {self.hi}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {self.lo}"
        return f"{'<' if self.hi_open else '<='} {self.hi}"


def _bound(text: str, whole: str, op: str) -> str:
    if not NUMBER.fullmatch(text):
        raise ValueError(f"{whole!r} starts with {op!r}, but {text!r} is not a number; {COMPARISON_ALLOWED}")
    exponent = text.lower().partition("e")[2].lstrip("+-")
    if len(exponent) > _MAX_BOUND_EXPONENT_DIGITS:
        raise ValueError(f"the exponent of {text!r} in {whole!r} is too large; {COMPARISON_ALLOWED}")
    return text


def parse_comparison(text: str) -> NumberRange | None:
    """A property value as a numeric comparison: "< N", "<= N", "> N", ">= N", or "N .. M"
    with two numbers. None when the value is a glob instead (it starts with neither < nor >
    and is not two numbers around ".."); ValueError for a value that starts with < or > but
    is no comparison."""
    op, a, b = _split(text)
    if op is None:
        return None
    if op == "..":
        if not (NUMBER.fullmatch(a) and NUMBER.fullmatch(b)):
            return None
        lo, hi = _bound(a, text, op), _bound(b, text, op)
        if compare_decimals(decimal_parts(lo), decimal_parts(hi)) > 0:
            raise ValueError(f"{text!r} matches no value (empty range); {COMPARISON_ALLOWED}")
        return NumberRange(lo=lo, hi=hi)
    if not a:
        raise ValueError(f"incomplete comparison {text!r}; {COMPARISON_ALLOWED}")
    bound = _bound(a, text, op)
    return {
        "<": NumberRange(hi=bound, hi_open=True),
        "<=": NumberRange(hi=bound),
        ">": NumberRange(lo=bound, lo_open=True),
        ">=": NumberRange(lo=bound),
    }[op]
