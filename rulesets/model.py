"""The data model of views: what a views file compiles to, and what is matched against it."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, fields
from functools import cached_property

from .expressions import TimeRule, parse_comparison
from .globs import expand_braces, glob_match, is_literal, literal_prefix, unescape

DEFAULT_TTL = 2.0

# The rules that select objects; everything else in a view is an option of the mount, but
# for `layout_by`: the handler's listings of such a view carry those property values.
# `accessed` is never set: it stays in specs as null so that the ids of views registered
# before it was refused stay the same.
FILTER_KEYS = ("bucket", "object", "size", "modified", "accessed", "properties", "tags", "metadata",
               "any", "not", "layout_by")
# The rules of a block of `any`/`not` (and of a view's top level, besides `bucket`).
BLOCK_KEYS = ("object", "size", "modified", "properties", "tags", "metadata")
# Where each property rule looks for a key: S3 tags, user metadata (x-amz-meta-*), or either.
PROPERTY_RULES = {"properties": ("tags", "metadata"), "tags": ("tags",), "metadata": ("metadata",)}
ACCESSED_REFUSED = ("S3 records no access time, so no rule can select by it; use `modified` "
                    "(the time of the last write) instead")

PropertyRules = dict[str, tuple[str | None, ...]]


@dataclass(frozen=True, kw_only=True)
class RuleBlock:
    """Rules that must all hold: one block of a view's `any`/`not`, or the top-level rules
    of a view besides `bucket` (View is built on RuleBlock; View.rules is that block alone).
    Property rules map a lowercased key to the accepted values: globs or numeric
    comparisons (expressions.parse_comparison) as text, None for "the key is absent"."""

    object: str | None = None
    size: tuple[int, int | None] | None = None
    modified: TimeRule | None = None
    properties: PropertyRules = field(default_factory=dict)
    tags: PropertyRules = field(default_factory=dict)
    metadata: PropertyRules = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(json.dumps(self.spec(), sort_keys=True))

    @property
    def is_time_dependent(self) -> bool:
        return self.modified is not None and self.modified.is_relative

    @property
    def reads_tags(self) -> bool:
        return bool(self.properties or self.tags)

    @property
    def reads_metadata(self) -> bool:
        return bool(self.properties or self.metadata)

    def property_rules(self):
        """(rule name, key, accepted values) of every property rule, in the PROPERTY_RULES order."""
        for name in PROPERTY_RULES:
            for key, values in getattr(self, name).items():
                yield name, key, values

    def spec(self) -> dict:
        """The rules that are set, canonical and JSON-serialisable."""
        spec = {}
        if self.object is not None:
            spec["object"] = self.object
        if self.size is not None:
            spec["size"] = [self.size[0], self.size[1]]
        if self.modified is not None:
            spec["modified"] = self.modified.spec()
        for name in PROPERTY_RULES:
            rules = getattr(self, name)
            if rules:
                spec[name] = {key: _canonical_values(values) for key, values in sorted(rules.items())}
        return spec

    @classmethod
    def from_spec(cls, spec: dict, what: str = "a block") -> "RuleBlock":
        if not isinstance(spec, dict):
            raise ValueError(f"{what} must be a mapping of rules")
        _refuse_accessed(spec, what)
        unknown = sorted(set(spec) - set(BLOCK_KEYS) - {"accessed"})
        if unknown:
            raise ValueError(f"unknown keys {unknown} in {what}; allowed: {', '.join(BLOCK_KEYS)}")
        if not any(spec.get(key) for key in BLOCK_KEYS):
            raise ValueError(f"{what} has no rule; give at least one of {', '.join(BLOCK_KEYS)}")
        return cls(**_rules_of(spec))


@dataclass(frozen=True, kw_only=True)
class View(RuleBlock):
    """One view of a views file: its top-level rules (the fields of RuleBlock) and its
    options. The answers that depend on every rule (is_time_dependent, reads_tags,
    reads_metadata) cover `any_of` and `none_of` too; spec() and property_rules() are
    those of the top level alone (View.rules), filter_spec() is the whole filter.

    ``size`` is ``(lo, hi)`` in bytes, both inclusive; ``hi`` is None when unbounded.
    ``properties``, ``tags`` and ``metadata`` are property rules (see RuleBlock). An object
    belongs to the view when its top-level rules hold, at least one block of ``any_of``
    holds (when there are any) and no block of ``none_of`` holds. ``set`` keeps the keys'
    spelling from the file.

    ``layout`` is how file names are made: "tree" or "flat". ``layout_by`` (lowercased
    property names, from ``layout: {by: [...]}``) adds one directory level per property
    above the files, which are then named as in "flat" (``layout`` is "flat"); None
    without such levels.

    ``eager_writes`` (from ``write: {eager: [...]}``) are globs of keys below ``root``
    whose files a mount writes back eagerly (their close returns before their upload); a
    mount option like ``ttl``, no part of the filter.
    """

    name: str
    bucket: str
    any_of: tuple[RuleBlock, ...] = ()
    none_of: tuple[RuleBlock, ...] = ()
    layout: str = "tree"
    layout_by: tuple[str, ...] | None = None
    root: str = ""
    set: dict[str, str] = field(default_factory=dict)
    ttl: float = DEFAULT_TTL
    writable: bool = True
    eager_writes: tuple[str, ...] = ()

    def __hash__(self) -> int:
        return hash((self.name, view_id(self.filter_spec())))

    def writes_eagerly(self, key: str) -> bool:
        """A file of ``key`` is written back eagerly: its key below ``root`` matches a glob
        of ``eager_writes``."""
        if not self.eager_writes or not key.startswith(self.root):
            return False
        below = key[len(self.root):]
        return any(glob_match(pattern, below) for pattern in self.eager_writes)

    @cached_property
    def rules(self) -> RuleBlock:
        """The top-level rules besides `bucket`, as a block of their own."""
        return RuleBlock(**{rule.name: getattr(self, rule.name) for rule in fields(RuleBlock)})

    @cached_property
    def blocks(self) -> tuple[RuleBlock, ...]:
        """Every block of rules: the top level, then `any`, then `not`."""
        return (self.rules,) + self.any_of + self.none_of

    @property
    def is_time_dependent(self) -> bool:
        """True when the view's answer can change with time alone (relative ages)."""
        return any(block.is_time_dependent for block in self.blocks)

    @property
    def reads_tags(self) -> bool:
        """True when some rule can read S3 tags (a `properties` or `tags` rule anywhere)."""
        return any(block.reads_tags for block in self.blocks)

    @property
    def reads_metadata(self) -> bool:
        """True when some rule can read user metadata (`properties` or `metadata`)."""
        return any(block.reads_metadata for block in self.blocks)

    @property
    def lists_properties(self) -> bool:
        """True when the handler's listings of the view carry the values of its ``layout_by``
        properties (so it needs the tags and metadata of its members)."""
        return bool(self.layout_by)

    def filter_spec(self) -> dict:
        """The filter rules only, canonical and JSON-serialisable (see view_id). The keys of
        the first version are always there and the newer ones only when set, so that views
        that use none of them keep their ids."""
        spec = {
            "bucket": self.bucket,
            "object": self.object,
            "size": None if self.size is None else [self.size[0], self.size[1]],
            "modified": None if self.modified is None else self.modified.spec(),
            "accessed": None,
            "properties": {key: _canonical_values(values) for key, values in sorted(self.properties.items())},
        }
        rules = self.rules.spec()
        for name in ("tags", "metadata"):
            if name in rules:
                spec[name] = rules[name]
        for name, blocks in (("any", self.any_of), ("not", self.none_of)):
            if blocks:
                # blocks are a set, like accepted values
                texts = sorted({json.dumps(block.spec(), sort_keys=True, ensure_ascii=False) for block in blocks})
                spec[name] = [json.loads(text) for text in texts]
        if self.layout_by:  # a set to the handler (the mount keeps the order of its levels)
            spec["layout_by"] = sorted({name.lower() for name in self.layout_by})
        return spec

    @classmethod
    def from_filter_spec(cls, name: str, spec: dict) -> "View":
        """Rebuild a view from filter_spec(); options get their defaults. Specs come from
        clients, so anything malformed raises ValueError saying what is wrong."""
        if not isinstance(spec, dict):
            raise ValueError("a filter spec must be a mapping")
        unknown = sorted(set(spec) - set(FILTER_KEYS))
        if unknown:
            raise ValueError(f"unknown filter keys {unknown}; allowed: {', '.join(FILTER_KEYS)}")
        _refuse_accessed(spec, "a view")
        bucket = spec.get("bucket")
        if not isinstance(bucket, str) or not bucket:
            raise ValueError("`bucket` must be a non-empty string")
        rules = _rules_of(spec)
        blocks = {}
        for key in ("any", "not"):
            value = spec.get(key)
            if value is None:
                blocks[key] = ()
                continue
            if not isinstance(value, list) or not value:
                raise ValueError(f"`{key}` must be a non-empty list of rule blocks")
            blocks[key] = tuple(RuleBlock.from_spec(block, f"a block of `{key}`") for block in value)
        layout_by = _layout_by_of(spec.get("layout_by"))
        return cls(
            name=name,
            bucket=bucket,
            any_of=blocks["any"],
            none_of=blocks["not"],
            root=default_root(rules["object"]),
            set=default_set(rules["properties"], tags=rules["tags"]),
            layout="flat" if layout_by else "tree",
            layout_by=layout_by,
            **rules,
        )


def _rules_of(spec: dict) -> dict:
    """The RuleBlock fields of a spec's rules (a view's top level or one block)."""
    return {"object": _object_of(spec.get("object")), "size": _size_of(spec.get("size")),
            "modified": _time_rule_of(spec.get("modified"), "modified"),
            **{name: _property_rules_of(spec.get(name), name) for name in PROPERTY_RULES}}


def _layout_by_of(names) -> tuple[str, ...] | None:
    if names is None:
        return None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError("`layout_by` must be a non-empty list of property names")
    for name in names:
        check_property_name(name)
    lowered = tuple(sorted({name.lower() for name in names}))
    if len(lowered) != len(names):
        raise ValueError("`layout_by` names a property twice")
    return lowered


def _refuse_accessed(spec: dict, what: str) -> None:
    if spec.get("accessed") is not None:
        raise ValueError(f"`accessed` in {what}: {ACCESSED_REFUSED}")


def _time_rule_of(spec, what: str) -> TimeRule | None:
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError(f"`{what}` must be a time rule mapping or null")
    try:
        return TimeRule.from_spec(spec)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"`{what}`: {exc}") from None


def _object_of(obj) -> str | None:
    if obj is None:
        return None
    if not isinstance(obj, str):
        raise ValueError("`object` must be a string or null")
    check_glob(obj)
    return obj


def _size_of(size) -> tuple[int, int | None] | None:
    if size is None:
        return None
    if (not isinstance(size, (list, tuple)) or len(size) != 2
            or not (isinstance(size[0], int) and not isinstance(size[0], bool))
            or not (size[1] is None or (isinstance(size[1], int) and not isinstance(size[1], bool)))
            or size[0] < 0 or (size[1] is not None and size[1] < size[0])
            or max(size[0], size[1] or 0) > 2**63 - 1):
        raise ValueError("`size` must be [lo, hi] with 0 <= lo <= hi < 2^63 (hi null: unbounded)")
    return size[0], size[1]


_RULE_ITEM = {"properties": "property", "tags": "tag", "metadata": "metadata key"}


def _property_rules_of(spec, what: str) -> PropertyRules:
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ValueError(f"`{what}` must map names to lists of values")
    rules = {}
    for key, values in spec.items():
        if (not isinstance(key, str) or not isinstance(values, (list, tuple)) or not values
                or not all(v is None or isinstance(v, str) for v in values)):
            raise ValueError(f"{_RULE_ITEM[what]} {key!r} must map to a non-empty list of strings or nulls")
        try:
            rules[key.lower()] = tuple(None if v is None else canonical_value(v) for v in values)
        except ValueError as exc:
            raise ValueError(f"`{what}` {key!r}: {exc}") from None
    return rules


# The characters S3 allows in a tag key; a property is read from a tag or user metadata of
# its name, so a name must at least be a possible tag key.
_PROPERTY_NAME = re.compile(r"[\w +\-=.:/@]{1,128}")


def check_property_name(name: str) -> None:
    """ValueError when `name` cannot be the name of a property (an S3 tag key)."""
    if not _PROPERTY_NAME.fullmatch(name) or not name.strip():
        raise ValueError(f"{name!r} is not a property name; allowed: 1-128 letters, digits, "
                         "spaces and + - = . _ : / @ (what S3 allows in a tag key)")
    if name.lower().startswith("aws:"):
        raise ValueError(f"{name!r} is not a property name: the prefix 'aws:' is reserved by S3")


def canonical_value(text: str) -> str:
    """An accepted property value as written canonically: a comparison in one spelling
    (">=3" is ">= 3"), a glob as it is. ValueError for a bad comparison or glob."""
    comparison = parse_comparison(text)
    if comparison is not None:
        return comparison.text
    check_glob(text)
    return text


def value_accepts(accepted: str, value: str) -> bool:
    """True when an accepted value of a property rule (a glob or a comparison, as
    canonical_value gives it) accepts the property value `value`."""
    comparison = parse_comparison(accepted)
    return comparison.accepts(value) if comparison is not None else glob_match(accepted, value)


def check_glob(pattern: str) -> None:
    """ValueError when the matcher cannot take `pattern` (braces expand too far)."""
    expand_braces(pattern)


@dataclass(slots=True)
class ObjectInfo:
    """What the matcher knows about one object. ``metadata`` keys come without the
    ``x-amz-meta-`` prefix. ``atime`` is read by no rule (S3 records no access time); it
    stays because callers pass tags and metadata after it by position."""

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
    if object_glob is None:
        return ""
    prefix = literal_prefix(object_glob)
    return prefix[: prefix.rfind("/") + 1]


def default_set(properties: PropertyRules, spelling: dict[str, str] | None = None,
                tags: PropertyRules | None = None) -> dict[str, str]:
    """Properties that files created in a view get by default (as tags): every `properties`
    or `tags` rule with a single, literal, non-null value (the only ones a new file can
    satisfy by itself; a comparison is not literal)."""
    result = {}
    for rules in (properties, tags or {}):
        for key, values in rules.items():
            value = values[0] if len(values) == 1 else None
            if value is not None and parse_comparison(value) is None and is_literal(value):
                result[(spelling or {}).get(key, key)] = unescape(value)
    return result
