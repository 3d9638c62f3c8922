"""Freezing the startup objects: garbage is collected first, what lives on is left alone."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from talkbridge.serving import freeze_startup_objects


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def unfreeze() -> Iterator[None]:
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfreeze")
def test_startup_garbage_is_collected_and_live_objects_are_frozen() -> None:
    garbage, alive = Node(), Node()
    garbage.other, alive.other = garbage, alive  # two cycles; only one stays referenced
    gone = weakref.ref(garbage)
    del garbage
    before = gc.get_freeze_count()

    freeze_startup_objects()

    assert gone() is None  # freed, not kept forever in the permanent generation
    assert gc.get_freeze_count() > before
    assert not any(obj is alive for obj in gc.get_objects())  # out of later collections
