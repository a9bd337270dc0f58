"""The routes of work-queue groups (docs/API.md, "Work-queue groups"; the groups
themselves: eventhandler/groups.py): joining, leaving, claiming (a long poll), renewing,
reporting a file done, failed or given back unworked, and a group's report."""
from __future__ import annotations

import asyncio
import time

from aiohttp import web

from .. import groups as wg
from .common import ApiError, key_arg, log, read_body, reply
from .core import ApiCore, Routes


async def catch_up(core: ApiCore, info, group, relist: bool = False) -> None:
    """Give the group the files of its view it has not seen (one catch-up at a time;
    a whole listing is read off the loop)."""
    async with group.lock:
        while relist or group.cursor != core.engine.buckets[info.bucket].committed:
            if relist or wg.needs_listing(core.engine, info, group):
                news = await asyncio.get_running_loop().run_in_executor(
                    None, wg.read_news, core.engine, info, group, True)
            else:  # a page of changes inline, as the change stream reads it
                news = wg.read_news(core.engine, info, group, False)
            group.feed(news)
            if not news["more"]:
                return
            relist = False
            await asyncio.sleep(0)  # the loop's other requests between pages


class GroupRoutes(Routes):
    def _group(self, request, *, create: bool = False):
        """The view (authorized as every view request) and the group named in the path;
        404 for a group that does not exist (unless ``create``: then None)."""
        info = self.core.view(request)
        name = request.match_info["group"]
        if not wg.NAME.fullmatch(name):
            raise ApiError(400, "bad_request", "a group name is 1 to 64 of A-Z a-z 0-9 . _ -")
        group = self.core.groups.get(info.id, name)
        if group is None and not create:
            raise ApiError(404, "not_found", f"no group {name!r} of view {info.id}: join it first")
        return info, name, group

    @staticmethod
    async def _group_body(request) -> dict:
        body = await read_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "bad_request", 'body must be {"member": ID, ...}')
        return body

    @staticmethod
    def _member_id(mid) -> str:
        if not isinstance(mid, str) or not wg.MEMBER.fullmatch(mid):
            raise ApiError(400, "bad_request", "member must be 1 to 128 of A-Z a-z 0-9 . _ : @ -")
        return mid

    def _member(self, request, group, mid, client: str = "") -> "wg.Member":
        member = group.member(self._member_id(mid), request["principal"], client, time.time())
        if member is None:
            raise ApiError(403, "forbidden", f"member {mid!r} of group {group.name!r} is another principal's")
        return member

    @staticmethod
    def _number(body: dict, name: str, default, lo, hi, kind=float):
        value = body.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi \
                or (kind is int and value != int(value)):
            raise ApiError(400, "bad_request", f"{name} must be a number from {lo} to {hi}")
        return kind(value)

    async def group_join(self, request: web.Request):
        """Join a group (made by the first join, with its lease and max_failures); with
        ``existing`` the files already in the view that the group has not seen become work."""
        info, name, group = self._group(request, create=True)
        body = await self._group_body(request)
        self._member_id(body.get("member"))  # (checked before a group is made)
        lease = self._number(body, "lease", wg.DEFAULT_LEASE, *wg.LEASE_RANGE)
        max_failures = self._number(body, "max_failures", wg.DEFAULT_MAX_FAILURES,
                                    *wg.MAX_FAILURES_RANGE, kind=int)
        await self.core.wait_ready(info, 30.0)
        if group is None:
            group = self.core.groups.get(info.id, name)  # (made meanwhile by another join)
        if group is None:
            group = self.core.groups.create(info.id, name, lease, max_failures,
                                       self.core.engine.buckets[info.bucket].committed)
            log.info("%s made group %r of view %s (lease %g s, %d attempts)", request["principal"],
                     name, info.id, lease, max_failures)
        member = self._member(request, group, body.get("member"), str(body.get("client") or "")[:200])
        await catch_up(self.core, info, group, relist=bool(body.get("existing")))
        return reply(request, {"group": name, "view": info.id, "member": member.id,
                               "lease": group.lease, "max_failures": group.max_failures})

    async def group_leave(self, request: web.Request):
        """A member leaves: the files it holds go to the others (the attempts not counted)."""
        _info, _name, group = self._group(request)
        member = self._member(request, group, request.match_info["member"])
        return reply(request, {"released": group.release(member.id)})

    async def group_claim(self, request: web.Request):
        """Up to ``max`` files for the member, each now in flight at it for a lease; waits
        up to ``wait`` seconds for one (a long poll)."""
        info, _name, group = self._group(request)
        body = await self._group_body(request)
        n = self._number(body, "max", 1, 1, 1000, kind=int)
        wait = self._number(body, "wait", 0.0, 0.0, 60.0)
        member = self._member(request, group, body.get("member"))
        deadline = time.monotonic() + wait
        grant_end = self.core.grants.until(request["principal"], info.bucket, info.view.root)
        member.waiting += 1
        try:
            while True:
                self.core.owned(info.bucket)  # (woken by a handoff of the bucket: 421)
                changed, released = self.core.hub.event(info.bucket), group.event
                await catch_up(self.core, info, group)
                now = time.time()
                files = group.claim(member.id, n, now)
                left = min(deadline - time.monotonic(), grant_end - now)
                if files or left <= 0 or member.id not in group.members:
                    return reply(request, {"files": files, "lease": group.lease})
                waits = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(released.wait())]
                # a lease that runs out meanwhile makes its file claimable
                await asyncio.wait(waits, timeout=max(0.0, min(left, group.next_expiry() - now)),
                                   return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
        finally:
            member.waiting -= 1
            member.seen = time.time()

    async def group_renew(self, request: web.Request):
        """Renew the leases of every file the member holds; answers the keys it holds
        (a file missing there was lost to another member)."""
        _info, _name, group = self._group(request)
        body = await self._group_body(request)
        member = self._member(request, group, body.get("member"))
        return reply(request, {"held": group.renew(member.id, time.time()), "lease": group.lease})

    async def group_done(self, request: web.Request):
        """The member is done with a file: ``ok`` true acknowledges it, false counts a
        failed attempt (``error``: why); ``give_back`` true returns it unworked, the attempt
        not counted (the member's mount could not show it)."""
        info, _name, group = self._group(request)
        body = await self._group_body(request)
        member = self._member(request, group, body.get("member"))
        key = body.get("key")
        if not isinstance(key, str):
            raise ApiError(400, "bad_request", "key must be the file's key")
        key_arg(key, "key")
        give_back = body.get("give_back", False)
        if not isinstance(give_back, bool):
            raise ApiError(400, "bad_request", "give_back must be true or false")
        if give_back:
            state = group.give_back(member.id, key, wg.in_view(self.core.engine, info, key))
            if state in ("pending", "removed"):
                log.info("member %s of group %r gave %s back (%s): now %s", member.id, group.name,
                         key, str(body.get("error") or "no reason given")[:200], state)
            return reply(request, {"key": key, "state": state})
        error = body.get("error")
        state = group.finish(member.id, key, body.get("ok") is not False,
                             error if isinstance(error, str) else None)
        return reply(request, {"key": key, "state": state})

    async def group_status(self, request: web.Request):
        info, _name, group = self._group(request)
        await catch_up(self.core, info, group)
        return reply(request, group.report(time.time()))
