"""Keeping Python's garbage collector, and its GIL, off the request path (the handler and
the mount).

A collection walks its generations with the GIL held. With the default thresholds a full
(generation 2) collection comes whenever the objects promoted since the last one exceed a
quarter of those that survived it, and walks every live object: measured with
``gc.callbacks``, 10-30 ms in the handler (8 in a 20 s latency run), and 15-92 ms each,
five of them, while a mount builds the directory of a 100,000-object view — a p99
latency term for events, a ~15 % term for ``ls -l``, at random moments.

``QuietGC.tick()``, called every second, collects the young generations (bounded by the
collector's thresholds: about a millisecond) and moves what survives out of the
collector's sight (``gc.freeze``, O(1)); automatic collections then only walk objects
younger than a second. Every ``full_every`` seconds everything is put back and collected
once, so cycles among older objects (a directory subtree dropped from a view, say) are
still freed: one predictable pause of ~110 ms per million live objects (1,000,000 inode-like
objects measured here) every 10 minutes, instead of unpredictable ones.
"""
from __future__ import annotations

import gc
import os
import sys
import time

# The GIL switch interval of both processes: a thread that gives the GIL up for a system
# call (the loop, writing a cache file) gets it back within this long from a busy thread
# (an upload, a consumer), instead of Python's default 5 ms — on one CPU, 5 ms at every
# such call while uploads run (measured: an eager untar of 2,450 files, 6.4 s).
SWITCH_INTERVAL = 0.0005


def prompt_gil_handoff() -> None:
    """Set the switch interval (``DELVEFS_SWITCH_INTERVAL`` seconds overrides it)."""
    sys.setswitchinterval(float(os.environ.get("DELVEFS_SWITCH_INTERVAL", SWITCH_INTERVAL)))


class QuietGC:
    def __init__(self, full_every: float = 600.0):
        self.full_every = full_every
        gc.freeze()  # what exists at start-up (modules, state loaded) stays out of sight
        self._last_full = time.monotonic()

    def tick(self) -> None:
        if time.monotonic() - self._last_full >= self.full_every:
            gc.unfreeze()
            gc.collect()
            self._last_full = time.monotonic()
        else:
            gc.collect(1)
        gc.freeze()
