"""Load and validate views files: YAML text -> list[View], or every problem at once.

Validation walks the composed YAML node tree rather than constructed Python data: nodes
keep their positions (for file:line:column), duplicate keys survive (ruamel would raise at
the first), and scalars keep the text the user wrote (``lane: 02`` means "02").
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from . import expressions
from .globs import literal_prefix
from .model import (ACCESSED_REFUSED, BLOCK_KEYS, DEFAULT_TTL, PROPERTY_RULES, RuleBlock, View,
                    canonical_value, check_glob, check_property_name, default_root, default_set, value_accepts)

FILTER_RULES = ("bucket",) + BLOCK_KEYS + ("any", "not")
OPTIONS = ("layout", "root", "set", "ttl", "writable", "write")
# The keys of a view's `write` option: how the closes of the files it names behave.
WRITE_POLICIES = ("eager",)
VIEW_KEYS = FILTER_RULES + OPTIONS
LAYOUTS = ("tree", "flat")
# How the items of each property rule are named in messages.
_ITEM = {"properties": "property", "tags": "tag", "metadata": "metadata key"}

_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_MERGE = "tag:yaml.org,2002:merge"
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GLOB_CHARS = "*?[{\\"
_YAML_ESCAPE_HINT = ("; in double quotes a backslash starts a YAML escape: write a value with a "
                     "backslash in single quotes ('\\> 2', '\\*') or double the backslash")


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a views file; line and column are 1-based."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


class ViewsError(Exception):
    """A views file is invalid; ``problems`` lists everything wrong with it."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def load_views(path: str | Path) -> list[View]:
    """Read and validate a views file; raises ViewsError (also for an unreadable file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ViewsError([Problem(str(path), 1, 1, f"cannot read the views file: {exc}")]) from None
    return parse_views(text, filename=str(path))


def parse_views(text: str, filename: str = "<string>") -> list[View]:
    """Validate views-file text; returns the views in file order or raises ViewsError."""
    return _Parser(filename).parse(text)


def _kind(node: Node | None) -> str:
    if node is None or (isinstance(node, ScalarNode) and node.tag == _NULL):
        return "nothing (null)"
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return repr(node.value)


def _flow_items(node: Node) -> list[str]:
    """The values of a property as they would be written in a flow list."""
    nodes = node.value if isinstance(node, SequenceNode) else [node]
    return ["~" if not isinstance(n, ScalarNode) or n.tag == _NULL else n.value for n in nodes]


def _text(node: ScalarNode) -> str | None:
    """A scalar as the text a user means: null -> None, booleans lowercased, else as written."""
    if node.tag == _NULL:
        return None
    if node.tag == _BOOL:
        return node.value.lower()
    return node.value


class _Parser:
    def __init__(self, filename: str):
        self.filename = filename
        self.problems: list[Problem] = []

    def problem(self, node: Node | None, message: str) -> None:
        line, column = (node.start_mark.line + 1, node.start_mark.column + 1) if node is not None else (1, 1)
        self.problems.append(Problem(self.filename, line, column, message))

    def parse(self, text: str) -> list[View]:
        try:
            root = YAML(typ="rt").compose(text)
        except MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            message = exc.problem or "invalid YAML"
            if exc.context:
                message += f" ({exc.context}"
                if exc.context_mark and exc.context_mark is not mark:
                    message += f" started at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
                message += ")"
            if "unknown escape character" in message:
                message += _YAML_ESCAPE_HINT
            line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            raise ViewsError([Problem(self.filename, line, column,
                                      f"YAML syntax error: {message}")]) from None
        if root is None or not isinstance(root, MappingNode):
            self.problem(root, f"a views file must be a mapping of view names to rules, "
                               f"found {'an empty file' if root is None else _kind(root)}")
            raise ViewsError(self.problems)
        views = []
        first_seen: dict[str, Node] = {}
        for key_node, value_node in self.entries(root, "view name"):
            name = self.view_name(key_node, first_seen)
            view = self.view(key_node.value, key_node, value_node)
            if name is not None and view is not None:
                views.append(view)
        if self.problems:
            self.problems.sort(key=lambda p: (p.line, p.column))
            raise ViewsError(self.problems)
        return views

    def entries(self, mapping: MappingNode, what: str) -> list[tuple[Node, Node]]:
        """The (key, value) pairs of a mapping with `<<` merges resolved; reports keys
        that are not scalars. Duplicates are left in for the caller to report."""
        explicit, merged = [], []
        for key_node, value_node in mapping.value:
            if key_node.tag == _MERGE:
                sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                for source in sources:
                    if isinstance(source, MappingNode):
                        merged.extend(self.entries(source, what))
                    else:
                        self.problem(source, f"`<<` merges a mapping, found {_kind(source)}")
            elif not isinstance(key_node, ScalarNode) or key_node.tag == _NULL:
                self.problem(key_node, f"a {what} must be a plain text, found {_kind(key_node)}")
            else:
                explicit.append((key_node, value_node))
        seen = {k.value for k, _ in explicit}
        for key_node, value_node in merged:
            if key_node.value not in seen:
                seen.add(key_node.value)
                explicit.append((key_node, value_node))
        return explicit

    def view_name(self, node: ScalarNode, first_seen: dict[str, Node]) -> str | None:
        name = node.value
        allowed = "a view name becomes a directory: any text except '', '.', '..' and names with '/' or NUL"
        if name in ("", ".", ".."):
            self.problem(node, f"view name {name!r} cannot be a directory name; {allowed}")
            return None
        if "/" in name or "\0" in name:
            self.problem(node, f"view name {name!r} contains {'/' if '/' in name else 'NUL'}; {allowed}")
            return None
        if name in first_seen:
            self.problem(node, f"duplicate view name {name!r} (first defined at line "
                               f"{first_seen[name].start_mark.line + 1}); every view needs its own name")
            return None
        first_seen[name] = node
        return name

    def scalar(self, node: Node, what: str, allow_null: bool = False) -> str | None:
        """The text of a scalar, or None after reporting what else was found."""
        if isinstance(node, ScalarNode) and (node.tag != _NULL or allow_null):
            return _text(node)
        self.problem(node, f"{what} must be a single value, found {_kind(node)}")
        return None

    def rule_nodes(self, node: MappingNode, allowed: tuple[str, ...], where: str) -> dict[str, Node]:
        """The rules of a view or block by name; reports unknown, refused and repeated keys."""
        rules: dict[str, Node] = {}
        for key_node, value_node in self.entries(node, "rule name"):
            key = key_node.value
            if key == "accessed":
                self.problem(key_node, f"`accessed` in {where} cannot be used: {ACCESSED_REFUSED}")
            elif key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.problem(key_node, f"unknown key {key!r} in {where}; {hint}allowed: {', '.join(allowed)}")
            elif key in rules:
                self.problem(key_node, f"duplicate key {key!r} in {where} (first at line "
                                       f"{rules[key].start_mark.line + 1}); each key may appear once")
            else:
                rules[key] = value_node
        return rules

    def view(self, name: str, name_node: Node, node: Node) -> View | None:
        if not isinstance(node, MappingNode):
            self.problem(node if node.tag != _NULL else name_node,
                         f"view {name!r} must be a mapping of rules (at least `bucket:`), found {_kind(node)}")
            return None
        before = len(self.problems)
        rules = self.rule_nodes(node, VIEW_KEYS, f"view {name!r}")
        fields: dict = {"name": name}
        if "bucket" not in rules:
            self.problem(name_node, f"view {name!r} has no `bucket`; every view needs one "
                                    "(the name of an S3 bucket, such as 'runs')")
        else:
            fields["bucket"] = self.bucket(rules["bucket"])
        spelling: dict[str, str] = {}
        fields.update(self.block_rules(rules, spelling))
        for key, field_name in (("any", "any_of"), ("not", "none_of")):
            if key in rules:
                fields[field_name] = self.blocks(rules[key], key, name)
        self.options(rules, fields, spelling)
        if len(self.problems) > before:
            return None
        return View(**fields)

    def block_rules(self, rules: dict[str, Node], spelling: dict[str, str] | None = None) -> dict:
        """The RuleBlock fields of the rules present (a view's top level or one block)."""
        fields: dict = {}
        if "object" in rules:
            fields["object"] = self.scalar(rules["object"], "`object` (a glob on the whole key)")
            if fields["object"] == "":
                self.problem(rules["object"], "`object` is empty; give a glob such as 'data/*.csv' "
                                              "or leave `object` out to match every key")
            elif fields["object"] is not None:
                self.glob(rules["object"], fields["object"], "`object`")
        for key, parser in (("size", expressions.parse_size), ("modified", expressions.parse_time)):
            if key in rules:
                text = self.scalar(rules[key], f"`{key}`")
                if text is not None:
                    try:
                        fields[key] = parser(text)
                    except ValueError as exc:
                        self.problem(rules[key], f"bad `{key}`: {exc}")
        for rule in PROPERTY_RULES:
            if rule in rules:
                fields[rule] = self.properties(rules[rule], rule, spelling)
        return fields

    def blocks(self, node: Node, key: str, name: str) -> tuple[RuleBlock, ...]:
        """The blocks of `any` (a list) or `not` (a list, or one block)."""
        what = "one block of rules or a list of blocks" if key == "not" else "a list of blocks of rules"
        example = f"`{key}: [{{object: '*.bam'}}, {{size: '> 1 GiB'}}]`"
        if key == "not" and isinstance(node, MappingNode):
            items = [node]
        elif isinstance(node, SequenceNode):
            items = node.value
            if not items:
                self.problem(node, f"`{key}` in view {name!r} has an empty list; give {what}, like {example}")
        else:
            self.problem(node, f"`{key}` in view {name!r} must be {what}, like {example}; found {_kind(node)}")
            return ()
        blocks = []
        for number, item in enumerate(items, start=1):
            where = f"block {number} of `{key}` in view {name!r}"
            if not isinstance(item, MappingNode):
                self.problem(item, f"{where} must be a mapping of rules ({', '.join(BLOCK_KEYS)}), "
                                   f"found {_kind(item)}")
                continue
            before = len(self.problems)
            rules = self.rule_nodes(item, BLOCK_KEYS, where)
            if not rules and len(self.problems) == before:
                self.problem(item, f"{where} has no rule; give at least one of {', '.join(BLOCK_KEYS)}")
            blocks.append(RuleBlock(**self.block_rules(rules)))
        return tuple(blocks)

    def glob(self, node: Node, pattern: str, what: str) -> None:
        try:
            check_glob(pattern)
        except ValueError as exc:
            self.problem(node, f"{what} {pattern!r}: {exc}")

    def bucket(self, node: Node) -> str | None:
        bucket = self.scalar(node, "`bucket`")
        if bucket is None:
            return None
        if any(c in bucket for c in _GLOB_CHARS):
            self.problem(node, f"bucket {bucket!r} is a glob: bucket globs are not supported by the handler "
                               "yet; name the bucket (one view per bucket)")
        elif not _BUCKET_NAME.match(bucket) or ".." in bucket:
            self.problem(node, f"{bucket!r} is not a valid bucket name; allowed: 3-63 characters "
                               "of a-z, 0-9, '.' and '-', starting and ending with a letter or digit")
        return bucket

    def properties(self, node: Node, rule: str, spelling: dict[str, str] | None
                   ) -> dict[str, tuple[str | None, ...]]:
        """A `properties`, `tags` or `metadata` rule; `spelling` collects the keys as written."""
        item = _ITEM[rule]
        if not isinstance(node, MappingNode):
            self.problem(node, f"`{rule}` must be a mapping of {item} names to values, found {_kind(node)}")
            return {}
        result: dict[str, tuple[str | None, ...]] = {}
        first_seen: dict[str, tuple[Node, list[str]]] = {}
        for key_node, value_node in self.entries(node, f"{item} name"):
            key = key_node.value.lower()
            if key in first_seen:
                first_key, values = first_seen[key]
                values.extend(_flow_items(value_node))
                self.problem(key_node, f"duplicate {item} {key_node.value!r} (first at line "
                                       f"{first_key.start_mark.line + 1}; names are compared "
                                       "case-insensitively): a key may appear once; to accept several "
                                       f"values write a list: {first_key.value}: [{', '.join(values)}]")
                continue
            first_seen[key] = (key_node, _flow_items(value_node))
            if spelling is not None:
                spelling[key] = key_node.value
            what = f"{item} {key_node.value!r}"
            if isinstance(value_node, SequenceNode):
                if not value_node.value:
                    self.problem(value_node, f"{what} has an empty list, which matches nothing; "
                                             "give at least one value")
                values = [self.value(item_node, what, self.scalar(item_node, f"each value of {what}",
                                                                  allow_null=True))
                          for item_node in value_node.value]
                result[key] = tuple(values)
            elif isinstance(value_node, ScalarNode):
                result[key] = (self.value(value_node, what, _text(value_node)),)
            else:
                self.problem(value_node, f"{what} must be a value, a list of values or null "
                                         f"(absent), found {_kind(value_node)}")
        return result

    def value(self, node: Node, what: str, text: str | None) -> str | None:
        """An accepted value in its canonical text; reports a bad comparison or glob (and
        gives None: the view is not built)."""
        if text is None:
            return None
        try:
            return canonical_value(text)
        except ValueError as exc:
            self.problem(node, f"{what}: {exc}")
            return None

    def options(self, rules: dict[str, Node], fields: dict, spelling: dict[str, str]) -> None:
        if "layout" in rules:
            self.layout(rules["layout"], fields)
        object_glob = fields.get("object")
        fields["root"] = default_root(object_glob)
        if "root" in rules:
            root = self.scalar(rules["root"], "`root`", allow_null=True) or ""
            start = literal_prefix(object_glob) if object_glob else ""
            if root and not root.endswith("/"):
                self.problem(rules["root"], f"root {root!r} must end with '/' (or be empty): it is "
                                            "the key prefix of the view's top directory")
            elif not start.startswith(root):
                self.problem(rules["root"], f"root {root!r} is not a prefix of every key `object` "
                                            f"{object_glob!r} matches; use a prefix of {start!r}"
                                            + ("" if object_glob else f", or add object: '{root}*'"))
            fields["root"] = root
        accepting = {rule: fields.get(rule, {}) for rule in ("properties", "tags")}
        fields["set"] = default_set(accepting["properties"], spelling, tags=accepting["tags"])
        if "set" in rules:
            fields["set"] = self.set_option(rules["set"], accepting)
        if "ttl" in rules:
            text = self.scalar(rules["ttl"], "`ttl`")
            fields["ttl"] = DEFAULT_TTL
            if text is not None:
                try:
                    fields["ttl"] = expressions.parse_duration(text)
                except ValueError as exc:
                    self.problem(rules["ttl"], f"bad `ttl`: {exc}")
        if "writable" in rules:
            node = rules["writable"]
            if not isinstance(node, ScalarNode) or node.tag != _BOOL:
                self.problem(node, f"`writable` must be true or false, found {_kind(node)}")
            else:
                fields["writable"] = node.value.lower() == "true"
        if "write" in rules:
            if not fields.get("writable", True):
                self.problem(rules["write"], "`write` in a view with `writable: false`: nothing "
                                             "is written through it; drop one of the two")
            fields["eager_writes"] = self.write_policy(rules["write"])

    def write_policy(self, node: Node) -> tuple[str, ...]:
        """`write: {eager: [glob, ...]}` (or one glob): the files whose closes return before
        their upload, by their path below the view's root."""
        example = "like `write: {eager: ['.snakemake/*', '*.log']}`"
        if not isinstance(node, MappingNode):
            self.problem(node, f"`write` must be a mapping, {example}; found {_kind(node)}")
            return ()
        policies = self.rule_nodes(node, WRITE_POLICIES, "`write`")
        if "eager" not in policies:
            if not node.value:
                self.problem(node, f"`write` is an empty mapping; give `eager`, {example}")
            return ()
        eager = policies["eager"]
        items = eager.value if isinstance(eager, SequenceNode) else [eager]
        if isinstance(eager, SequenceNode) and not items:
            self.problem(eager, f"`eager` in `write` has an empty list; give at least one glob, {example}")
        globs: list[str] = []
        for item in items:
            pattern = self.scalar(item, f"each glob of `eager` in `write` ({example})")
            if pattern is None:
                continue
            if pattern == "" or pattern.startswith("/"):
                self.problem(item, f"`eager` glob {pattern!r} in `write` must name a path below "
                                   "the view's directory, such as '.snakemake/*' (no leading '/')")
                continue
            before = len(self.problems)
            self.glob(item, pattern, "`eager` glob in `write`")
            if len(self.problems) == before:
                globs.append(pattern)
        return tuple(globs)

    def layout(self, node: Node, fields: dict) -> None:
        """`layout: tree`, `layout: flat`, or `layout: {by: [property, ...]}` (one directory
        level per property, files named as in flat)."""
        allowed = "allowed: tree, flat, or {by: [property, ...]}"
        if isinstance(node, MappingNode):
            options = self.rule_nodes(node, ("by",), "`layout`")
            if "by" not in options:
                if len(node.value) == 0:
                    self.problem(node, f"`layout` is an empty mapping; {allowed}")
                return
            fields["layout"] = "flat"
            fields["layout_by"] = self.layout_by(options["by"])
            return
        if not isinstance(node, ScalarNode) or node.tag == _NULL:
            self.problem(node, f"`layout` must be tree, flat or a mapping with `by`, found {_kind(node)}")
            return
        layout = _text(node)
        if layout not in LAYOUTS:
            self.problem(node, f"unknown layout {layout!r}; {allowed}")
        fields["layout"] = layout

    def layout_by(self, node: Node) -> tuple[str, ...]:
        """The property names of `layout: {by: ...}`, lowercased (a name or a list of names)."""
        example = "like `layout: {by: [sample, lane]}`"
        items = node.value if isinstance(node, SequenceNode) else [node]
        if isinstance(node, SequenceNode) and not items:
            self.problem(node, f"`by` in `layout` has an empty list; name at least one property, {example}")
        names: list[str] = []
        first_seen: dict[str, Node] = {}
        for item in items:
            name = self.scalar(item, f"each property of `by` in `layout` ({example})")
            if name is None:
                continue
            try:
                check_property_name(name)
            except ValueError as exc:
                self.problem(item, f"`by` in `layout`: {exc}")
                continue
            key = name.lower()
            if key in first_seen:
                self.problem(item, f"property {name!r} appears twice in `by` of `layout` (first at "
                                   f"line {first_seen[key].start_mark.line + 1}; names are compared "
                                   "case-insensitively): each gives one directory level")
                continue
            first_seen[key] = item
            names.append(key)
        return tuple(names)

    def set_option(self, node: Node, accepting: dict[str, dict[str, tuple[str | None, ...]]]) -> dict[str, str]:
        """The `set` option; every value must satisfy the view's own `properties` and `tags`
        rules on its key (files get them as tags)."""
        if not isinstance(node, MappingNode):
            self.problem(node, f"`set` must be a mapping of property names to values, found {_kind(node)}")
            return {}
        result: dict[str, str] = {}
        first_seen: dict[str, Node] = {}
        for key_node, value_node in self.entries(node, "property name"):
            key = key_node.value.lower()
            if key in first_seen:
                self.problem(key_node, f"duplicate key {key_node.value!r} in `set` (first at line "
                                       f"{first_seen[key].start_mark.line + 1}); a file gets one value per property")
                continue
            first_seen[key] = key_node
            value = self.scalar(value_node, f"`set` {key_node.value!r}")
            if value is None:
                continue
            for rule, rules in accepting.items():
                wanted = rules.get(key)
                if wanted is not None and not any(v is not None and value_accepts(v, value) for v in wanted):
                    self.problem(value_node, f"`set` gives {key_node.value}={value!r}, but the view's "
                                             f"{rule} accept only {list(wanted)!r}: files created in "
                                             "the view would not belong to it")
                    break
            result[key_node.value] = value
        return result

