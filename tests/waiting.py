"""Deterministic waiting: poll a condition until it holds, never a fixed sleep."""
from __future__ import annotations

import time


class ConditionTimeout(AssertionError):
    pass


def wait_until(condition, timeout: float = 10.0, what: str = "condition", interval: float = 0.02):
    """Return condition()'s first truthy value; raise ConditionTimeout naming ``what``."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise ConditionTimeout(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        time.sleep(interval)
