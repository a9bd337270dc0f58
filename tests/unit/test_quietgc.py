"""QuietGC: young garbage is still collected each tick; frozen garbage at the full one."""
from __future__ import annotations

import gc
import weakref

import pytest

from delvefs.shared.quietgc import QuietGC


class Cycle:
    def __init__(self):
        self.me = self


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()
    gc.collect()


def test_a_tick_collects_young_cycles_and_freezes_survivors(unfrozen):
    quiet = QuietGC(full_every=3600)
    assert gc.get_freeze_count() > 0
    young = Cycle()
    gone = weakref.ref(young)
    kept = Cycle()
    del young
    quiet.tick()
    assert gone() is None                    # garbage younger than a tick: collected
    assert not any(o is kept for o in gc.get_objects())  # survivors: out of the collector's walk
    assert kept.me is kept


def test_the_full_collection_frees_cycles_that_were_frozen(unfrozen):
    quiet = QuietGC(full_every=3600)
    old = Cycle()
    gone = weakref.ref(old)
    quiet.tick()                             # alive at this tick: frozen
    del old
    quiet.tick()
    assert gone() is not None                # out of sight of the young collections
    quiet.full_every = 0
    quiet.tick()
    assert gone() is None
