"""The mount's views: one record per view (:class:`ViewState`), the overlay entries of
local changes (:class:`Pending`) and :class:`ViewCatalog`, which holds the views and
answers which view an object belongs to (the compiled matcher).

The catalog owns the list of views and the name -> view map; only ``replace`` (a reload
of the views file) changes them, without an await. A dropped or replaced ViewState is
``retired``: no longer refreshed, its open files served as they are, its dirty files
uploaded all the same (``can_match`` says yes), and ``by_name`` keeps it until its name is
used again. The fields of a ViewState are changed by the parts that own what they stand
for: ``Listings`` (``listing``: registration, versions, freshness), ``Tree`` (the overlay,
the unshown keys), ``PropertyLayout`` (``places``).
"""
from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import trio

from .inodes import Dir, relative_path
from .layout import Places

RETRY_FIRST, RETRY_MAX = 1.0, 10.0  # backoff between failed refreshes of a stale view
EARLIER_KEPT = 32  # an older upload forgotten: its change is ignored until the bound anyway


class Pending:
    """One local change of a view not yet confirmed by the handler (the overlay).
    ``local``: a dirty file (its local content wins until uploaded); ``leaving``: being
    deleted or moved away by this mount right now (no change of it applies until the
    operation has put its outcome in the tree); ``put``: uploaded
    with ``etag`` (retired when a change with that ETag arrives); ``delete``: gone
    (retired when the handler reports the key gone). ``earlier``: the ETags of this
    mount's earlier uploads of the key whose changes have not arrived yet, oldest first —
    the change of an earlier upload of the same content must not retire a later one, and
    (a ``delete``, ``leaving`` or ``local`` entry) the handler's news of a removal while
    one of them is still to come is of an older removal than this mount's: deletes carry
    no time, and the handler reports a key's states in order.
    ``since``: the wall-clock time the change was made (a put: its request started); the
    handler keeps only the newest change of a key, so a version of another writer whose
    time is later is newer than this mount's change and retires it at once. ``before``
    (``local`` only): the ``delete`` it took the place of — a file created where this
    mount had just deleted one — back in force when the new file goes without an upload.
    ``retag`` (``put`` only): a change of the version's tags, which keep its ETag — retired
    by a change with that ETag that places the file where this mount did."""

    __slots__ = ("kind", "etag", "deadline", "earlier", "since", "before", "retag")

    def __init__(self, kind: str, etag: str | None, deadline: float, earlier: tuple = (),
                 since: float = math.inf, before: "Pending | None" = None, retag: bool = False):
        self.kind = kind
        self.etag = etag
        self.deadline = deadline
        self.earlier = earlier[-EARLIER_KEPT:]
        self.since = since
        self.before = before
        self.retag = retag

    def unconfirmed(self) -> tuple:
        """The ETags of this mount's uploads still to be confirmed, oldest first."""
        if self.kind == "put":
            return (*self.earlier, self.etag)
        return self.earlier

    def reported(self, etag: str) -> bool:
        """The handler reported a version ``etag``: when it is one of ``earlier``, that one
        and those before it are confirmed (True)."""
        if etag not in self.earlier:
            return False
        self.earlier = self.earlier[self.earlier.index(etag) + 1:]
        return True


def local_pending(previous: Pending | None) -> Pending:
    """The overlay entry of a file being written (dirty) that was ``previous``."""
    if previous is not None and previous.kind == "local":
        return previous
    return Pending("local", None, math.inf, previous.unconfirmed() if previous else (),
                   before=previous if previous is not None and previous.kind == "delete" else None)


class Refresh:
    """A listing or delta under way for a view; tasks that need the view wait for it and
    share its outcome (rather than each asking the handler again: a view of a bucket still
    being scanned would make every waiter wait for its own 503 in turn)."""
    __slots__ = ("done", "error", "started", "first")

    def __init__(self, started: float, first: bool):
        self.done = trio.Event()
        self.error = None  # FsError of a failed refresh
        self.started = started
        self.first = first  # the view's first listing (waited for, however long it takes)


class Listing:
    """What the mount knows of a view's listing at the handler (the ``Listings`` part's
    alone: registration, versions, freshness, outages)."""
    __slots__ = ("id", "version", "listed", "fresh_at", "refreshing", "relist", "stale",
                 "stale_since", "retry_at", "retry_delay", "lists", "deltas")

    def __init__(self):
        self.id: str | None = None
        self.version = 0
        self.listed = False
        self.fresh_at = float("-inf")
        self.refreshing: Refresh | None = None
        self.relist = False  # the handler lost the view: list it again rather than a delta
        self.stale: str | None = None  # why the handler gave no refresh lately (else None)
        self.stale_since = 0.0  # wall-clock time of the outage's start
        self.retry_at = float("-inf")  # a stale view's next refresh starts no earlier
        self.retry_delay = RETRY_FIRST
        self.lists = 0  # statistics (tests, logs)
        self.deltas = 0


class ViewState:
    """One mounted view: its definition, the handler's id and version, its top dir."""

    def __init__(self, view, index: int):
        self.view = view
        self.name = view.name
        self.bucket = view.bucket
        self.root = view.root or ""
        # layout by properties: lowercase property names, one directory level each; file
        # names as in flat (inodes.py)
        by = getattr(view, "layout_by", None)
        self.layout_by = tuple(by) if by else None
        self.by = tuple(name.lower() for name in by) if by else None
        self.flat = view.layout == "flat" or self.by is not None
        self.layout = view.layout
        self.places = Places()  # where its files are (a layout by properties; layout.py's)
        # a cut long name (inodes.fit_name) -> what it stands for: a directory's property
        # value, a file's key below the root (kept for the mount's life: a name stands for one)
        self.long_names: dict[str, str] = {}
        self.unshown: dict[str, str] = {}  # key -> why it has no name here (delvefs status)
        self.set = dict(getattr(view, "set", None) or {})
        self.index = index  # position in the mount's views (the matcher's answers)
        self.overlay: dict[str, Pending] = {}  # key -> local change not yet seen in a delta
        self.ttl = float(view.ttl)
        self.writable = bool(view.writable)
        self.listing = Listing()  # the handler's id, version and freshness (views.py's)
        self.top: Dir | None = None
        self.retired = False  # dropped or replaced by a reload of the views file


    def remember_cut(self, name: str, full: str) -> None:
        """A cut long name (``inodes.fit_name``) stands for ``full`` for the mount's life."""
        self.long_names[name] = full


def stale_text(vs: ViewState) -> str:
    """``user.delvefs.stale``: "0", or "1 since <UTC time>: <reason>"."""
    li = vs.listing
    if li.stale is None:
        return "0"
    since = datetime.fromtimestamp(li.stale_since, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"1 since {since}: {li.stale}"


class ViewCatalog:
    """The views of the mount and which of them an object belongs to."""

    def __init__(self, views):
        self.views: list[ViewState] = [ViewState(v, i) for i, v in enumerate(views)]
        self.by_name: dict[str, ViewState] = {vs.name: vs for vs in self.views}
        self._matcher = None

    def __iter__(self):
        return iter(self.views)

    def of_bucket(self, bucket: str):
        """The views of ``bucket`` (a generator: asked on every write that grows a file)."""
        return (vs for vs in self.views if vs.bucket == bucket)

    def get(self, name: str | None) -> ViewState | None:
        """The view of that name (a retired one too, until its name is used again)."""
        return self.by_name.get(name)

    def replace(self, states: list[ViewState]) -> None:
        """A reload: ``states`` are the mount's views now (no await in between)."""
        for i, vs in enumerate(states):
            vs.index = i
            self.by_name[vs.name] = vs
        self.views = states
        self._matcher = None

    def _compiled(self):
        if self._matcher is None:
            from rulesets.matcher import compile_views
            self._matcher = compile_views([vs.view for vs in self.views])
        return self._matcher

    def can_match(self, vs: ViewState, key: str, size: int, tags: dict,
                  metadata: dict | None = None) -> bool:
        """Whether an object ``key`` of ``size`` with ``tags`` (and user ``metadata``) would
        be in view ``vs`` (and shown as a file there): the scratch rule asks this before
        every upload, rmdir of each object S3 has below the directory."""
        rel = relative_path(vs, key)
        if rel is None or rel.endswith("/"):
            return False
        if vs.retired:  # dropped by a reload: what was written in it is uploaded all the same
            return True
        from rulesets.model import ObjectInfo
        obj = ObjectInfo(vs.bucket, key, int(size), time.time(), None, dict(tags), dict(metadata or {}))
        return vs.index in self._compiled().match(obj)

    def needs_tags(self, bucket: str) -> bool:
        return any(vs.view.reads_tags for vs in self.views if vs.bucket == bucket)

    def path_of(self, bucket: str, key: str, view: str | None = None) -> str:
        """The mount path (VIEW/relative path) of an object: in view ``view`` when given,
        else in the first view that shows it; ``bucket/key`` when none does."""
        if view is not None:
            vs = self.by_name.get(view)
            return f"{bucket}/{key}" if vs is None else f"{vs.name}/{relative_path(vs, key) or key}"
        for vs in self.views:
            rel = relative_path(vs, key) if vs.bucket == bucket else None
            if rel is not None:
                return f"{vs.name}/{rel}"
        return f"{bucket}/{key}"
