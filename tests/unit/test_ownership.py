"""Each piece of the mount's state has one owner, checked over the source (AST), not promised.

Rules over the client's modules (``delvefs/client``: the mount, its core ``mount/fs/``, the
handler's client, the commands):

1. A part never assigns or mutates a field of another part: no ``self.other.field = ...``,
   ``self.other.field[k] = ...``, ``del self.other.field[k]``, ``self.other.field += ...``
   or ``self.other.field.append(...)`` (or another mutating method) — it calls a method of
   that part instead.
0. The rooms' imports go one way: ``commands`` may use ``mount`` and ``handler``, ``mount``
   may use ``handler``, ``handler`` neither.
2. The fields of a record (the classes in :data:`RECORDS`) are assigned or mutated only in
   the modules that own it (a method of the record itself may, through ``self``). A field
   name that two records share is owned by the owners of both.

The table below is the ownership map: changing an owner is a design decision, made here.
"""
from __future__ import annotations

import ast
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "delvefs" / "client"

# record class -> (the module defining it, the modules that may change its fields)
RECORDS: dict[str, tuple[str, frozenset[str]]] = {
    # the read-ahead's per-handle state
    "Stream": ("mount/fs/readahead.py", frozenset({"mount/fs/readahead.py"})),
    # a layout by properties: each view's places
    "Places": ("mount/fs/layout.py", frozenset({"mount/fs/layout.py"})),
    # what the mount knows of a view's listing at the handler
    "Listing": ("mount/fs/catalog.py", frozenset({"mount/fs/listings.py"})),
    "Refresh": ("mount/fs/catalog.py", frozenset({"mount/fs/listings.py"})),
    # the overlay of local changes
    "Pending": ("mount/fs/catalog.py", frozenset({"mount/fs/tree.py"})),
    # the tree: its shape and what a node shows
    "Node": ("mount/fs/inodes.py", frozenset({"mount/fs/inodes.py", "mount/fs/tree.py"})),
    "File": ("mount/fs/inodes.py", frozenset({"mount/fs/inodes.py", "mount/fs/tree.py"})),
    "Dir": ("mount/fs/inodes.py", frozenset({"mount/fs/inodes.py", "mount/fs/tree.py"})),
    # open files: a reading handle is the reads part's, a writing one the writes part's
    "ReadHandle": ("mount/fs/handles.py", frozenset({"mount/fs/reads.py"})),
    "WriteHandle": ("mount/fs/handles.py", frozenset({"mount/fs/writes.py"})),
    "FileHandle": ("mount/fs/handles.py", frozenset({"mount/fs/reads.py", "mount/fs/writes.py",
                                                    "mount/fs/handles.py"})),  # (closing one)
    "DirHandle": ("mount/fs/handles.py", frozenset({"mount/fs/attributes.py"})),
    # a cached object: the cache (its bytes and bound) and the write side (dirty state)
    "CacheEntry": ("mount/cache/cacheentry.py", frozenset({"mount/cache/datacache.py", "mount/cache/cachebound.py", "mount/fs/written.py"})),
    # a dirty file's ranges log
    "RangesLog": ("mount/cache/rangeslog.py", frozenset({"mount/cache/rangeslog.py", "mount/fs/written.py"})),
    # a fetch of blocks under way
    "Fetch": ("mount/cache/cacheentry.py", frozenset({"mount/cache/datacache.py"})),
    # passthrough: a backing file, and an inode's open files
    "Backing": ("mount/passthrough.py", frozenset({"mount/passthrough.py"})),
    "InodeIO": ("mount/passthrough.py", frozenset({"mount/passthrough.py"})),
}

MUTATORS = frozenset({"append", "extend", "insert", "pop", "popitem", "remove", "clear",
                      "update", "setdefault", "add", "discard", "move_to_end", "sort"})


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(CLIENT)): ast.parse(p.read_text(), str(p))
            for p in sorted(CLIENT.rglob("*.py"))}


def _fields(tree: ast.Module, name: str) -> set[str]:
    """The fields of class ``name``: its ``__slots__``, else what its ``__init__`` sets."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            fields = set()
            for item in node.body:
                if isinstance(item, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets):
                    fields |= {e.value for e in item.value.elts}
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    for sub in ast.walk(item):
                        for t in _targets(sub):
                            if isinstance(t, ast.Attribute) and _is_self(t.value):
                                fields.add(t.attr)
            return fields
    raise AssertionError(f"no class {name}")


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _targets(node: ast.AST) -> list[ast.AST]:
    """The attribute expressions ``node`` assigns, deletes or mutates in place."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in MUTATORS:
        return [node.func.value] if isinstance(node.func.value, ast.Attribute) else []
    else:
        return []
    out = []
    for t in targets:
        for e in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
            while isinstance(e, ast.Subscript):  # x.field[k] = ...: mutates x.field
                e = e.value
            if isinstance(e, ast.Attribute):
                out.append(e)
    return out


def _changes(modules: dict[str, ast.Module]):
    """(module, line, the changed attribute expression) for every change not through
    ``self.field`` directly."""
    for name, tree in modules.items():
        for node in ast.walk(tree):
            for t in _targets(node):
                if not _is_self(t.value):
                    yield name, node.lineno, t


def test_no_part_changes_another_parts_fields():
    bad = [f"{m}:{line}: {ast.unparse(t)}" for m, line, t in _changes(_modules())
           if isinstance(t.value, ast.Attribute) and _is_self(t.value.value)]
    assert not bad, "a part changes another part's fields (call a method of it):\n" + "\n".join(bad)


def test_records_are_changed_only_by_their_owners():
    modules = _modules()
    owners: dict[str, set[str]] = {}
    for record, (defined, owned_by) in RECORDS.items():
        for field in _fields(modules[defined], record):
            owners.setdefault(field, set()).update(owned_by)
    bad = [f"{m}:{line}: {ast.unparse(t)} (owned by {', '.join(sorted(owners[t.attr]))})"
           for m, line, t in _changes(modules)
           if t.attr in owners and m not in owners[t.attr]]
    assert not bad, "a record's field changed outside its owners:\n" + "\n".join(bad)


def test_the_check_sees_a_change_through_another_part():
    """The rules catch what they are for (a check that cannot fail proves nothing)."""
    tree = ast.parse("class A:\n def f(self):\n  self.b.x = 1\n  self.b.y.append(2)\n"
                     "  del self.b.z[3]\n  h.window += 1\n  self.mine = 4\n")
    found = sorted(ast.unparse(t) for _, _, t in _changes({"m.py": tree}))
    assert found == ["h.window", "self.b.x", "self.b.y", "self.b.z"]


ROOMS_MAY_USE = {"handler": set(), "mount": {"handler"}, "commands": {"mount", "handler"}}


def test_the_rooms_import_one_way():
    bad = []
    for name, tree in _modules().items():
        room = name.split("/")[0]
        if room not in ROOMS_MAY_USE:
            continue
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                parts = t.split(".")
                if parts[:2] == ["delvefs", "client"] and len(parts) > 2:
                    other = parts[2]
                    if other != room and other not in ROOMS_MAY_USE[room]:
                        bad.append(f"{name}:{node.lineno}: imports {t}")
    assert not bad, "an import against the rooms' direction:\n" + "\n".join(bad)


MOST_ARGUMENTS = 9  # a part needing more is given a subsystem (mount/fs/subsystems.py)


def test_no_part_of_the_core_takes_more_than_a_few_arguments():
    wide = []
    for name, tree in _modules().items():
        if not name.startswith("mount/fs/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        a = item.args
                        n = len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs)
                        if n > MOST_ARGUMENTS:
                            wide.append(f"{name}: {node.name} takes {n}")
    assert not wide, "constructors too wide (group parts into a subsystem):\n" + "\n".join(wide)
