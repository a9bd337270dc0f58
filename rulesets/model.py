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
        if spec.get("kind") not in ("age", "time"):
            raise ValueError(f"time rule kind must be 'age' or 'time', not {spec.get('kind')!r}")
        bound = lambda v: None if v is None else float(v)  # noqa: E731
        return cls(spec["kind"], bound(spec.get("lo")), bound(spec.get("hi")),
                   bool(spec.get("lo_open", False)), bool(spec.get("hi_open", False)))


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
            "properties": {key: list(values) for key, values in sorted(self.properties.items())},
        }

    @classmethod
    def from_filter_spec(cls, name: str, spec: dict) -> "View":
        """Rebuild a view from filter_spec(); options get their defaults."""
        size = spec.get("size")
        modified, accessed = spec.get("modified"), spec.get("accessed")
        properties = {str(key).lower(): tuple(values)
                      for key, values in (spec.get("properties") or {}).items()}
        obj = spec.get("object")
        return cls(
            name=name,
            bucket=spec["bucket"],
            object=obj,
            size=None if size is None else (int(size[0]), None if size[1] is None else int(size[1])),
            modified=None if modified is None else TimeRule.from_spec(modified),
            accessed=None if accessed is None else TimeRule.from_spec(accessed),
            properties=properties,
            root=default_root(obj),
            set=default_set(properties),
        )


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
