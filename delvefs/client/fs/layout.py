"""Layout by properties (``vs.by``): where a file goes depends on the object's property
values, not on its key alone. ``vs.values`` holds each key's values as last known (the
``properties`` the handler's listings and changes carry for such a view, or this mount's
own tags), ``vs.placed`` the directories its file is in now; ``put`` moves a file whose
values changed to its new directory (same inode). What the write side
needs: ``implied_tags`` (tags of a file created in a directory), ``mkdir_property``,
``layout_dir_tags`` (a file moved to another directory takes its values as tags).

These methods are :class:`delvefs.client.fs.tree.Tree`'s (a mixin: they use its table,
``find``, ``put``, ``prune``, ``mkdir_local`` and notifier) and never await either.
"""
from __future__ import annotations

import errno

from ..errors import FsError
from .catalog import ViewState
from .inodes import Dir, File, dir_value, is_cut, layout_values, value_dir


class PropertyLayout:
    """Where files go in a view laid out by property values (``vs.by``)."""

    def _value_dir(self, vs: ViewState, value: str | None) -> str:
        name = value_dir(value)
        if is_cut(name):  # a cut long value: remember what it stands for
            vs.long_names[name] = value
        return name

    def _layout_known(self, vs: ViewState, obj: dict) -> bool:
        """Whether ``obj``'s place in ``vs`` (a layout by properties) is known: from its
        ``properties`` (the handler's listings and changes of such a view carry them, as do
        this mount's own changes), else from before."""
        key = obj["key"]
        props = obj.get("properties")
        if props is not None:
            vs.values[key] = layout_values(vs.by, props)
            return True
        return key in vs.values

    def _placed_elsewhere(self, vs: ViewState, obj: dict) -> bool:
        """Whether the handler's ``obj`` would place its key elsewhere than this mount has
        it now (a layout by properties; tags and metadata change no ETag)."""
        props = obj.get("properties")
        return vs.by is not None and props is not None and \
            layout_values(vs.by, props) != vs.values.get(obj["key"])

    def _unplace(self, vs: ViewState, key: str) -> File | None:
        """The file of ``key``, taken out of its directory when its values now belong in
        another one (the caller puts it there: it keeps its inode)."""
        dirs = vs.placed.get(key)
        values = vs.values.get(key)
        if dirs is None or values is None or list(dirs) == [self._value_dir(vs, v) for v in values]:
            return None
        node = self.find(vs, key)
        del vs.placed[key]
        if node is None or node.is_dir:
            return None
        parent = node.parent
        del parent.children[node.name]
        parent.changed()
        if self._known(parent):
            self.notifier.entry(parent.ino, node.name)
        self._served.pop(node.ino, None)
        self.prune(parent)
        return node

    def _dir_values(self, d: Dir) -> list[str | None] | None:
        """The property values the directories from a layout-by view's top down to ``d``
        stand for (None when ``d`` is not in such a view)."""
        vs = d.view
        if vs is None or vs.by is None:
            return None
        names = []
        while d is not vs.top:
            names.append(d.name)
            d = d.parent
        return [dir_value(n, vs.long_names) for n in reversed(names)]

    def layout_dir_tags(self, d: Dir) -> dict | None:
        """What a file in ``d``, a directory of a layout by properties, has as tags:
        ``{"values", "tags", "untag"}`` (``_unset``: the tag removed); None in other layouts.
        EPERM above the last level."""
        values = self._dir_values(d)
        if values is None:
            return None
        vs = d.view
        if len(values) != len(vs.by):
            raise FsError(errno.EPERM, f"view {vs.name}: files live {len(vs.by)} directory levels "
                          f"down, one per property ({', '.join(vs.layout_by)})")
        return {"values": tuple(values),
                "tags": {name: v for name, v in zip(vs.layout_by, values) if v is not None},
                "untag": sorted(name for name, v in zip(vs.layout_by, values) if v is None)}

    def values_of(self, vs: ViewState, key: str) -> tuple | None:
        """The property values ``key`` is placed by in ``vs`` (a layout by properties)."""
        return vs.values.get(key)

    def place(self, node: File, values: tuple) -> None:
        """A file of a layout by properties goes where ``values`` say (a dirty file retagged:
        tagged at its upload; a value that is user metadata)."""
        vs = node.parent.view
        if not node.gone and vs.values.get(node.key) != values:
            vs.values[node.key] = values
            self.put(vs, {"key": node.key, "size": node.size, "mtime": node.mtime_ns / 1e9,
                          "etag": node.etag}, notify=True, remote=False, written=True)

    def implied_tags(self, parent: Dir, key: str) -> dict | None:
        """A file created in ``parent``, a directory of a layout by properties, gets its
        directories' values as tags: ``{"tags", "untag"}`` for its dirty record; None in
        other layouts. EPERM above the last level; EEXIST when the key is in another one."""
        implied = self.layout_dir_tags(parent)
        if implied is None:
            return None
        vs = parent.view
        values = implied.pop("values")
        where = vs.placed.get(key)
        if where is not None and list(where) != [self._value_dir(vs, v) for v in values]:
            raise FsError(errno.EEXIST, f"{key} is in {vs.name}/{'/'.join(where)} (a name is one "
                          "object in every directory of a layout by properties)")
        vs.values[key] = values
        return implied

    def mkdir_property(self, parent: Dir, name: str) -> Dir:
        """mkdir in a layout by properties: a directory for a property value (EINVAL for a
        name no value has; EPERM below the last level). It exists in this mount only until a
        file lands in it, like any mkdir'ed directory."""
        vs = parent.view
        depth = len(self._dir_values(parent))
        if depth >= len(vs.by):
            raise FsError(errno.EPERM, f"view {vs.name}: {len(vs.by)} directory levels, one per "
                          f"property ({', '.join(vs.layout_by)}); files below the last")
        try:
            dir_value(name, vs.long_names)
        except ValueError as exc:
            raise FsError(errno.EINVAL, str(exc)) from None
        if name in parent.children:
            raise FsError(errno.EEXIST)
        return self.mkdir_local(parent, name, parent.prefix)
