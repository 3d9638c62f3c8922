"""Which inbound messages a store may already hold, answered in memory.

A Bloom filter over (connection id, native id). It never calls a key new that was added to it
(no false negatives), and calls about one new key in a hundred "maybe seen" at capacity. The
router uses it to start handling a new message at once, while the store's write of it is still on
its way; only a "maybe" waits for the store's own verdict. The store builds it from its records
(`Store.seen_inbound`) in its writer, so it crosses to the event loop as bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from hashlib import blake2b

BITS_PER_KEY = 12
"""With four probes: ~0.6 % of new keys called "maybe seen" when the filter is at capacity."""
PROBES = 4
MIN_CAPACITY = 1 << 20
"""What the router asks for at the least (a 2 MiB filter): one that starts empty is not rebuilt
soon."""


def _size_bits(capacity: int) -> int:
    """A power of two (so a probe is a mask), at most 2**32 (four 32-bit probes per digest)."""
    return min(1 << 32, 1 << (max(capacity, 1) * BITS_PER_KEY - 1).bit_length())


_probes = struct.Struct(f"<{PROBES}I").unpack
"""A 128-bit digest as four 32-bit probes."""


def _key(connection_id: str, native_id: str) -> bytes:
    # surrogatepass: an id is whatever the platform sent, lone surrogates included
    return f"{connection_id}\x1f{native_id}".encode("utf-8", "surrogatepass")


class SeenFilter:
    __slots__ = ("_bits", "_mask", "capacity", "count")

    def __init__(self, capacity: int) -> None:
        self._set_bits(bytearray(_size_bits(capacity) // 8))
        self.count = 0
        """Keys added, including those it was built from."""

    def _set_bits(self, bits: bytearray) -> None:
        size = len(bits) * 8
        if size & (size - 1) or not 8 <= size <= 1 << 32:
            raise ValueError(f"a filter has a power of two bits up to 2**32, not {size}")
        self._bits = bits
        self._mask = size - 1
        self.capacity = size // BITS_PER_KEY
        """Keys it holds at its intended error rate; past that, "maybe" grows more common."""

    @classmethod
    def of(cls, keys: Iterable[tuple[str, str]], capacity: int) -> SeenFilter:
        built = cls(capacity)
        for connection_id, native_id in keys:
            built.add(connection_id, native_id)
        return built

    def dump(self) -> tuple[bytes, int]:
        """What crosses from the writer: `restore` takes it back."""
        return bytes(self._bits), self.count

    @classmethod
    def restore(cls, dumped: tuple[bytes, int]) -> SeenFilter:
        bits, count = dumped
        restored = cls.__new__(cls)
        restored._set_bits(bytearray(bits))
        restored.count = count
        return restored

    def add(self, connection_id: str, native_id: str) -> bool:
        """Add a key; True when it was certainly not in the filter before."""
        bits, mask = self._bits, self._mask
        new = False
        for probe in _probes(blake2b(_key(connection_id, native_id), digest_size=16).digest()):
            at = probe & mask
            byte, bit = at >> 3, at & 7
            old = bits[byte]
            if not old >> bit & 1:
                bits[byte] = old | 1 << bit
                new = True
        self.count += 1
        return new
