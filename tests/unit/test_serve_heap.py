"""``serve`` runs with start-up's objects frozen and a higher first-generation threshold
(docs/decisions/318-serve-settles-its-heap.md), and gives both back on the way out."""

from __future__ import annotations

import gc

import pytest

from quotagate.http.service import SERVE_GC_THRESHOLD, settled_heap


def test_start_up_objects_are_frozen_and_young_collections_come_less_often_while_serving(
) -> None:
    before = gc.get_threshold()
    gc.unfreeze()
    survivor = [object()]  # a container made before serving starts
    with settled_heap():
        assert gc.get_freeze_count() > 0
        # In the permanent generation: no collection walks it.
        assert all(survivor is not candidate
                   for generation in range(3) for candidate in gc.get_objects(generation))
        assert gc.get_threshold() == (SERVE_GC_THRESHOLD, *before[1:])
        assert before[0] < SERVE_GC_THRESHOLD
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_settings_come_back_when_serving_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), settled_heap():
        raise RuntimeError("the server did not start")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
