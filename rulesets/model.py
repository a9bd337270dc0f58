"""The data model of views: what a views file compiles to, and what is matched against it."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

DEFAULT_TTL = 2.0

# The rules that select objects; everything else in a view is an option of the mount.
FILTER_KEYS = ("bucket", "object", "size", "modified", "accessed", "properties")


@dataclass(frozen=True)
class TimeRule:
    """A `modified`/`accessed` rule: an interval over an age (``kind="age"``, seconds
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


@dataclass(frozen=True)
class View:
    """One view of a views file.

    ``size`` is ``(lo, hi)`` in bytes, both inclusive; ``hi`` is None when unbounded.
    ``properties`` maps a lowercased key to the accepted values (globs); a None value
    means "the key is absent". ``set`` keeps the keys' spelling from the file.
    """

    name: str
    bucket: str
    object: str | None = None
    size: tuple[int, int | None] | None = None
    modified: TimeRule | None = None
    accessed: TimeRule | None = None
    properties: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    layout: str = "tree"
    root: str = ""
    set: dict[str, str] = field(default_factory=dict)
    ttl: float = DEFAULT_TTL
    writable: bool = True

    def __hash__(self) -> int:
        return hash((self.name, view_id(self.filter_spec())))

    @property
    def is_time_dependent(self) -> bool:
        """True when the view's answer can change with time alone (relative ages)."""
        return any(rule is not None and rule.is_relative for rule in (self.modified, self.accessed))

    def filter_spec(self) -> dict:
        """The filter rules only, canonical and JSON-serialisable (see view_id)."""
        return {
            "bucket": self.bucket,
            "object": self.object,
            "size": None if self.size is None else [self.size[0], self.size[1]],
            "modified": None if self.modified is None else self.modified.spec(),
            "accessed": None if self.accessed is None else self.accessed.spec(),
            "properties": {key: _canonical_values(values) for key, values in sorted(self.properties.items())},
        }

    @classmethod
    def from_filter_spec(cls, name: str, spec: dict) -> "View":
        """Rebuild a view from filter_spec(); options get their defaults. Specs come from
        clients, so anything malformed raises ValueError saying what is wrong."""
        if not isinstance(spec, dict):
            raise ValueError("a filter spec must be a mapping")
        unknown = sorted(set(spec) - set(FILTER_KEYS))
        if unknown:
            raise ValueError(f"unknown filter keys {unknown}; allowed: {', '.join(FILTER_KEYS)}")
        bucket, obj = spec.get("bucket"), spec.get("object")
        if not isinstance(bucket, str) or not bucket:
            raise ValueError("`bucket` must be a non-empty string")
        if obj is not None and not isinstance(obj, str):
            raise ValueError("`object` must be a string or null")
        size = spec.get("size")
        if size is not None:
            if (not isinstance(size, (list, tuple)) or len(size) != 2
                    or not all(isinstance(b, int) and not isinstance(b, bool) for b in (size[0],))
                    or not (size[1] is None or (isinstance(size[1], int) and not isinstance(size[1], bool)))
                    or size[0] < 0 or (size[1] is not None and size[1] < size[0])
                    or max(size[0], size[1] or 0) > 2**63 - 1):
                raise ValueError("`size` must be [lo, hi] with 0 <= lo <= hi < 2^63 (hi null: unbounded)")
            size = (size[0], size[1])
        properties_spec = spec.get("properties") or {}
        if not isinstance(properties_spec, dict):
            raise ValueError("`properties` must map names to lists of values")
        properties = {}
        for key, values in properties_spec.items():
            if (not isinstance(key, str) or not isinstance(values, (list, tuple)) or not values
                    or not all(v is None or isinstance(v, str) for v in values)):
                raise ValueError(f"property {key!r} must map to a non-empty list of strings or nulls")
            properties[key.lower()] = tuple(values)
        return cls(
            name=name,
            bucket=bucket,
            object=obj,
            size=size,
            modified=_time_rule_of(spec.get("modified"), "modified"),
            accessed=_time_rule_of(spec.get("accessed"), "accessed"),
            properties=properties,
            root=default_root(obj),
            set=default_set(properties),
        )


def _time_rule_of(spec, what: str) -> TimeRule | None:
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError(f"`{what}` must be a time rule mapping or null")
    try:
        return TimeRule.from_spec(spec)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"`{what}`: {exc}") from None


@dataclass(slots=True)
class ObjectInfo:
    """What the matcher knows about one object. ``metadata`` keys come without the
    ``x-amz-meta-`` prefix. ``atime`` None means "never read since written" (mtime is used)."""

    bucket: str
    key: str
    size: int
    mtime: float
    atime: float | None = None
    tags: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)


def _canonical_values(values: tuple[str | None, ...]) -> list[str | None]:
    """Accepted values are a set: order and repetition do not change a filter."""
    return sorted(set(values), key=lambda v: (v is not None, v or ""))


def view_id(spec: dict) -> str:
    """Stable 16-hex-digit id of a filter spec: equal filters share one id."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def default_root(object_glob: str | None) -> str:
    """The literal start of the object glob, cut after its last '/'."""
    from .globs import literal_prefix

    if object_glob is None:
        return ""
    prefix = literal_prefix(object_glob)
    return prefix[: prefix.rfind("/") + 1]


def default_set(properties: dict[str, tuple[str | None, ...]],
                spelling: dict[str, str] | None = None) -> dict[str, str]:
    """Properties that files created in a view get by default: every property rule with
    a single, literal, non-null value (the only ones a new file can satisfy by itself)."""
    from .globs import is_literal, unescape

    result = {}
    for key, values in properties.items():
        if len(values) == 1 and values[0] is not None and is_literal(values[0]):
            result[(spelling or {}).get(key, key)] = unescape(values[0])
    return result
