"""Views files that change without a remount, the mount's side of ``delvefs reload MOUNT``
(delvefs/client/commands/reload.py) and of SIGHUP.

Both make the mount read the views file it was started with again (its absolute path is
recorded at mount). An invalid file changes nothing: the error (file:line:column, what is
wrong) is the answer to ``delvefs reload`` and a log line. A valid one is registered with
the event handler as a whole, with proofs of S3 list rights that cover its views (as at
mount), and then replaces the mount's views (``FileSystem.reload``): new view directories
appear, dropped ones disappear, changed ones are listed anew; the kernel is told to forget
the names of the mount's root that changed.
"""
from __future__ import annotations

import logging
import signal

from .control import ControlError
from ..handler.proofs import proof_prefixes
from .viewsfile import ViewsFileError, load_views

log = logging.getLogger("delvefs.client.mount.reload")


class ViewsReloader:
    """The mount's side: ``control`` answers the "reload" operation, ``watch_hangups``
    reloads on SIGHUP. ``proofs`` is the mount's :class:`delvefs.client.handler.proofs.Proofs`;
    ``read_only``: the mount is read-only (so is every view it reads)."""

    def __init__(self, views_path: str | None, core, proofs, *, read_only: bool = False):
        self.views_path = views_path
        self.core = core
        self.proofs = proofs
        self.read_only = read_only

    async def reload(self) -> dict:
        import trio

        from ..handler.api import HandlerError
        if self.views_path is None:
            raise ControlError("this mount does not know the views file it was started with")
        try:
            views = await trio.to_thread.run_sync(load_views, self.views_path, self.read_only)
        except ViewsFileError as exc:
            log.warning("views not reloaded, the mount keeps its views: %s", exc)
            raise ControlError(f"{exc}; the mount keeps its views") from None
        keeper = self.proofs
        async with keeper.guard():  # not while proofs are renewed with the old prefixes
            before = keeper.prefixes
            keeper.prefixes = proof_prefixes(views)
            try:
                signed_at = trio.current_time()
                proofs = await keeper.sign()
                summary = await self.core.reload(views, proofs)
            except HandlerError as exc:
                keeper.prefixes = before
                log.warning("views not reloaded, the mount keeps its views: %s", exc)
                raise ControlError(f"the event handler did not take the views of "
                                   f"{self.views_path}: {exc}; the mount keeps its views") from None
            except Exception as exc:  # signing (credentials), or a bug: said, and logged
                keeper.prefixes = before
                log.exception("views not reloaded, the mount keeps its views")
                raise ControlError(f"reloading {self.views_path}: {type(exc).__name__}: {exc}; "
                                   "the mount keeps its views") from None
            if summary["added"] or summary["removed"] or summary["changed"]:
                keeper.presented(signed_at)
        return summary

    async def control(self, args: dict) -> dict:
        return await self.reload()

    async def watch_hangups(self, task_status=None) -> None:
        import trio
        with trio.open_signal_receiver(signal.SIGHUP) as hangups:
            if task_status is not None:
                task_status.started()
            async for _ in hangups:
                log.info("SIGHUP: reading the views file %s again", self.views_path)
                try:
                    await self.reload()
                except ControlError:
                    pass  # logged


def summary_lines(summary: dict) -> list[str]:
    lines = [f"{what} {', '.join(summary[what])}" for what in ("added", "removed", "changed")
             if summary.get(what)]
    return lines or ["views unchanged"]
