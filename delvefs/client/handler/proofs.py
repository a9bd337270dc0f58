"""A mount's proofs of S3 list rights for the event handler (docs/API.md, "Who sees what").

The handler shows this mount's principal only the views it has proved it may list in S3:
the proofs go with the registration (no extra round trip), :meth:`Proofs.keep_fresh`
renews them at half their lifetime (``DELVEFS_PROOF_LIFETIME``), and a view request the
handler answers as if it held none registers the views again with new ones
(:meth:`Proofs.reprove`), then is sent once more.
"""
from __future__ import annotations

import functools
import logging
from typing import Awaitable, Callable

log = logging.getLogger("delvefs.client.handler.proofs")


def proof_prefixes(views) -> dict[str, list[str]]:
    """``{bucket: [prefix, ...]}``: what this mount must prove it may list — the root of each
    view as the handler computes it from the view's spec (the literal start of its object
    glob, up to the last '/'), without roots below another root of the same bucket."""
    from rulesets.model import default_root
    roots: dict[str, set[str]] = {}
    for v in views:
        roots.setdefault(v.bucket, set()).add(default_root(v.object))
    return {b: sorted(r for r in rs if not any(r != o and r.startswith(o) for o in rs))
            for b, rs in sorted(roots.items())}


class Proofs:
    """Presigned ListObjectsV2 URLs of each bucket and view root, bound to the mount's
    principal, valid ``lifetime`` seconds. The handler lets the principal read the views
    only as long as the URLs it was shown are valid, so :meth:`keep_fresh` presents new
    ones at half their lifetime, and :meth:`reprove` (the handler client's and the core's
    hook) at once when the handler answers a view request as if it held none: a restart
    lost them, or the mount slept past their expiry. Signed without botocore when the S3
    settings have an endpoint and static keys (``client`` None), else with the boto3
    ``client``. ``register(proofs)`` registers the mount's views with new proofs."""

    def __init__(self, views, s3_settings, principal: str, lifetime: int, *,
                 register: Callable[[dict], Awaitable[None]], client=None):
        self.prefixes = proof_prefixes(views)
        self.s3_settings, self.principal, self.lifetime = s3_settings, principal, lifetime
        self.client = client
        self.register = register
        self.signed_at = 0.0      # trio time the proofs the handler holds were signed
        self.renewed_at = float("-inf")
        self._lock = None

    def sign_lean(self) -> dict[str, list[str]] | None:
        """Proofs presigned without botocore (None when the settings need it)."""
        from delvefs.shared import s3
        proofs = {b: [s3.presign_list_url(self.s3_settings, b, prefix=p, principal=self.principal,
                                          expires=self.lifetime) for p in prefixes]
                  for b, prefixes in self.prefixes.items()}
        return None if any(None in urls for urls in proofs.values()) else proofs

    async def sign(self) -> dict[str, list[str]]:
        import trio

        from delvefs.shared import s3
        if self.client is None:
            return self.sign_lean()
        return {b: [await trio.to_thread.run_sync(functools.partial(
                    s3.presigned_list_url, self.client, b, prefix=p, principal=self.principal,
                    expires=self.lifetime)) for p in prefixes]
                for b, prefixes in self.prefixes.items()}

    def presented(self, signed_at: float) -> None:
        """The handler accepted proofs signed at ``signed_at`` (trio time)."""
        import trio
        self.signed_at = signed_at
        self.renewed_at = trio.current_time()

    async def keep_fresh(self, handler) -> None:
        """Present new proofs at half the lifetime of the last ones; after a failure, retry
        soon (the handler's grants last until the old proofs expire)."""
        import trio
        while True:
            await trio.sleep_until(self.signed_at + self.lifetime / 2)
            try:
                async with self.guard():
                    signed_at = trio.current_time()
                    await handler.prove(await self.sign())
                    self.presented(signed_at)
            except Exception as exc:  # noqa: BLE001 — the handler, or signing (credentials); the mount goes on
                log.warning("renewing the proofs of S3 list rights with the event handler: %s", exc)
                await trio.sleep(min(30.0, self.lifetime / 10))

    async def reprove(self) -> None:
        """Register the views again with new proofs, unless another task did since the
        handler's answer that asks for it."""
        import trio
        asked = trio.current_time()
        async with self.guard():
            if self.renewed_at >= asked:
                return
            signed_at = trio.current_time()
            try:
                proofs = await self.sign()
            except Exception as exc:  # noqa: BLE001 — the request's own refusal stands
                log.warning("cannot sign new proofs of S3 list rights: %s", exc)
                return
            await self.register(proofs)
            self.presented(signed_at)
            log.info("presented new proofs to the event handler (it held none valid)")

    def guard(self):
        """The lock held while proofs are signed and presented (renewal, reprove, reload)."""
        import trio
        if self._lock is None:
            self._lock = trio.Lock()
        return self._lock
