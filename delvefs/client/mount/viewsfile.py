"""A mount's views file, read at mount and again at each reload (`delvefs reload`, SIGHUP)."""
from __future__ import annotations

import dataclasses


class ViewsFileError(Exception):
    """A one-line, user-facing reason why the views file cannot be used."""


def load_views(path: str, read_only: bool = False) -> list:
    """The views of the file at ``path``; ``read_only`` (a read-only mount) makes every view
    read-only. Raises ViewsFileError."""
    from rulesets.loader import ViewsError, load_views as load
    try:
        views = load(path)
    except ViewsError as exc:
        raise ViewsFileError(f"invalid views file: {'; '.join(str(exc).splitlines())}") from None
    except OSError as exc:
        raise ViewsFileError(f"cannot read views file {path}: {exc.strerror}") from None
    if not views:
        raise ViewsFileError(f"views file {path} defines no views")
    if read_only:  # one rule for writes: the views' own (EROFS, 0444/0555), at mount and reload
        views = [dataclasses.replace(v, writable=False) for v in views]
    return views
