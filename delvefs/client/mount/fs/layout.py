"""Layout by properties (``vs.by``): where a file goes depends on the object's property
values, not on its key alone.

The part :class:`PropertyLayout` owns, per such view, a :class:`Places` (``vs.places``):
each key's values as last known (the ``properties`` the handler's listings and changes
carry for such a view, or this mount's own tags) and the directories its file is in now.
Only this module changes a Places. The tree asks it where a key goes (``dirs_of``) and
tells it where a file went (``placed``); the tree moves a file whose values changed to its
new directory (same inode). What the write side needs: ``implied_tags`` (tags of a file
created in a directory), ``check_mkdir``, ``dir_tags`` (a file moved to another directory
takes its values as tags). Nothing here awaits.
"""
from __future__ import annotations

import errno

from ..errors import FsError
from .inodes import Dir, dir_value, is_cut, layout_values, unshowable_values, value_dir


class Places:
    """One view's layout-by-properties state (the layout part's alone)."""
    __slots__ = ("values", "placed")

    def __init__(self):
        self.values: dict[str, tuple] = {}  # key -> its property values (where it belongs)
        self.placed: dict[str, tuple[str, ...]] = {}  # key -> the directories its file is in


class PropertyLayout:
    """Where files go in a view laid out by property values (``vs.by``)."""

    def value_dir(self, vs, value: str | None) -> str:
        """The directory name of a property value (a cut long value is remembered)."""
        name = value_dir(value)
        if is_cut(name):
            vs.remember_cut(name, value)
        return name

    def dirs_of(self, vs, key: str) -> list[str] | None:
        """The directories ``key``'s file belongs in by its values; None while they are
        unknown or have no directory name."""
        values = vs.places.values.get(key)
        if values is None or unshowable_values(values) is not None:
            return None
        return [self.value_dir(vs, v) for v in values]

    def unshowable(self, vs, key: str) -> str | None:
        """Why ``key``'s values give it no directory (None: they do, or are unknown)."""
        return unshowable_values(vs.places.values.get(key) or ())

    def known(self, vs, obj: dict) -> bool:
        """Whether ``obj``'s place in ``vs`` is known: from its ``properties`` (recorded
        now), else from before."""
        key = obj["key"]
        props = obj.get("properties")
        if props is not None:
            vs.places.values[key] = layout_values(vs.by, props)
            return True
        return key in vs.places.values

    def placed_elsewhere(self, vs, obj: dict) -> bool:
        """Whether the handler's ``obj`` would place its key elsewhere than this mount has
        it now (tags and metadata change no ETag)."""
        props = obj.get("properties")
        return vs.by is not None and props is not None and \
            layout_values(vs.by, props) != vs.places.values.get(obj["key"])

    def moving(self, vs, key: str) -> bool:
        """Whether ``key``'s file is in directories its values no longer name (the tree
        takes it out, ``unplace``, and puts it where they say, ``placed``)."""
        dirs = vs.places.placed.get(key)
        values = vs.places.values.get(key)
        return not (dirs is None or values is None
                    or list(dirs) == [self.value_dir(vs, v) for v in values])

    def unplace(self, vs, key: str) -> None:
        vs.places.placed.pop(key, None)

    def placed_at(self, vs, key: str) -> tuple[str, ...] | None:
        """The directories ``key``'s file is in now (None: not placed)."""
        return vs.places.placed.get(key)

    def placed(self, vs, key: str, dirs) -> None:
        vs.places.placed[key] = tuple(dirs)

    def forget(self, vs, key: str) -> None:
        """``key`` left the view."""
        vs.places.values.pop(key, None)
        vs.places.placed.pop(key, None)

    def sweep(self, vs, seen: set[str]) -> None:
        """After a relist: forget the keys the listing did not contain."""
        p = vs.places
        for known in (p.values, p.placed):
            for key in [k for k in known if k not in seen]:
                del known[key]

    def dir_values(self, d: Dir) -> list[str | None] | None:
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

    def dir_tags(self, d: Dir) -> dict | None:
        """What a file in ``d``, a directory of a layout by properties, has as tags:
        ``{"values", "tags", "untag"}`` (``untag``: the tags removed); None in other
        layouts. EPERM above the last level."""
        values = self.dir_values(d)
        if values is None:
            return None
        vs = d.view
        if len(values) != len(vs.by):
            raise FsError(errno.EPERM, f"view {vs.name}: files live {len(vs.by)} directory levels "
                          f"down, one per property ({', '.join(vs.layout_by)})")
        return {"values": tuple(values),
                "tags": {name: v for name, v in zip(vs.layout_by, values) if v is not None},
                "untag": sorted(name for name, v in zip(vs.layout_by, values) if v is None)}

    def values_of(self, vs, key: str) -> tuple | None:
        """The property values ``key`` is placed by in ``vs``."""
        return vs.places.values.get(key)

    def set_values(self, vs, key: str, values: tuple) -> bool:
        """``key`` has ``values`` now (this mount retagged it); whether that changed them."""
        if vs.places.values.get(key) == values:
            return False
        vs.places.values[key] = values
        return True

    def implied_tags(self, parent: Dir, key: str) -> dict | None:
        """A file created in ``parent``, a directory of a layout by properties, gets its
        directories' values as tags: ``{"tags", "untag"}`` for its dirty record; None in
        other layouts. EPERM above the last level; EEXIST when the key is in another one."""
        implied = self.dir_tags(parent)
        if implied is None:
            return None
        vs = parent.view
        values = implied.pop("values")
        where = vs.places.placed.get(key)
        if where is not None and list(where) != [self.value_dir(vs, v) for v in values]:
            raise FsError(errno.EEXIST, f"{key} is in {vs.name}/{'/'.join(where)} (a name is one "
                          "object in every directory of a layout by properties)")
        vs.places.values[key] = values
        return implied

    def check_mkdir(self, parent: Dir, name: str) -> None:
        """mkdir in a layout by properties makes a directory for a property value: EINVAL
        for a name no value has, EPERM below the last level, EEXIST when there."""
        vs = parent.view
        depth = len(self.dir_values(parent))
        if depth >= len(vs.by):
            raise FsError(errno.EPERM, f"view {vs.name}: {len(vs.by)} directory levels, one per "
                          f"property ({', '.join(vs.layout_by)}); files below the last")
        try:
            dir_value(name, vs.long_names)
        except ValueError as exc:
            raise FsError(errno.EINVAL, str(exc)) from None
        if name in parent.children:
            raise FsError(errno.EEXIST)
