"""The router's seen keys: a store that cannot build the first filter is asked again later."""

from __future__ import annotations

from talkbridge.errors import StoreError
from talkbridge.router.seen_keys import SeenKeys
from talkbridge.store.seen import SeenFilter


class FlakyStore:
    """Fails the first build (its writer was being replaced), then builds."""

    def __init__(self) -> None:
        self.builds = 0

    async def seen_inbound(self, capacity: int) -> SeenFilter:
        self.builds += 1
        if self.builds == 1:
            raise StoreError("the writer process exited unexpectedly")
        return SeenFilter(capacity)


async def test_a_failed_first_build_is_retried_and_misses_nothing_meanwhile() -> None:
    store = FlakyStore()
    keys = SeenKeys(store, retry_after=0)  # type: ignore[arg-type]
    keys.start()
    assert await keys.current() is None
    assert not keys.add(("c", "before-the-retry"))  # no filter: the store decides
    seen = await keys.current()  # that arrival asked again
    assert store.builds == 2 and seen is not None
    assert not keys.add(("c", "before-the-retry"))  # it went into the new filter
    assert keys.add(("c", "new"))
