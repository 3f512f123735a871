"""The server process's collector settings (rindle_app.realtime.tuning)."""

import gc
import weakref

import pytest

from rindle_app.realtime.tuning import SERVER_THRESHOLD0, tune_gc


@pytest.fixture
def restored_gc():
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class _Node:
    pass


def test_tune_gc_freezes_what_is_loaded_and_raises_the_young_threshold(restored_gc):
    gc.unfreeze()
    _young, middle, old = gc.get_threshold()
    tune_gc()
    assert gc.get_freeze_count() > 1000  # Django and the app, out of the collector's walk
    assert gc.get_threshold() == (SERVER_THRESHOLD0, middle, old)


def test_cycles_made_after_tuning_are_still_collected(restored_gc):
    tune_gc(threshold0=50)
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    del a, b
    gc.collect()
    assert alive() is None


def test_a_threshold_below_one_is_refused(restored_gc):
    before = gc.get_threshold()
    with pytest.raises(ValueError, match="positive"):
        tune_gc(threshold0=0)
    assert gc.get_threshold() == before
