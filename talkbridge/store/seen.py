"""Which inbound messages a store may already hold, answered in memory.

A Bloom filter over (connection id, native id). It never calls a key new that was added to it
(no false negatives), and calls about one new key in a hundred "maybe seen" at capacity. Blocked:
a key's probes all fall in one 64-byte block, so a lookup in the 2 MiB array costs one cache miss,
not four (measured: the filter cost the core benchmark 6 % with four, ~2 % with one). The
router uses it to start handling a new message at once, while the store's write of it is still on
its way; only a "maybe" waits for the store's own verdict. The store builds it from its records
(`Store.seen_inbound`) in its writer, so it crosses to the event loop as bytes.
"""

from __future__ import annotations

import struct
from hashlib import blake2b

BITS_PER_KEY = 12
"""With four probes in 512-bit blocks: under 1 % of new keys called "maybe seen" at capacity."""
BLOCK_BITS = 512
"""One cache line."""
MIN_CAPACITY = 1 << 20
"""What the router asks for at the least (a 2 MiB filter): one that starts empty is not rebuilt
soon."""


def _size_bits(capacity: int) -> int:
    """A power of two (blocks and probes are masks), at most 2**32."""
    wanted = max(capacity * BITS_PER_KEY, BLOCK_BITS)
    return min(1 << 32, 1 << (wanted - 1).bit_length())


_words = struct.Struct("<4I").unpack
"""A 128-bit digest as four 32-bit words: one picks the block, two give the four probes."""


def _key(connection_id: str, native_id: str) -> bytes:
    # surrogatepass: an id is whatever the platform sent, lone surrogates included
    return f"{connection_id}\x1f{native_id}".encode("utf-8", "surrogatepass")


class SeenFilter:
    __slots__ = ("_bits", "_blocks", "capacity", "count")

    def __init__(self, capacity: int) -> None:
        self._set_bits(bytearray(_size_bits(capacity) // 8))
        self.count = 0
        """Keys added, including those it was built from."""

    def _set_bits(self, bits: bytearray) -> None:
        size = len(bits) * 8
        if size & (size - 1) or not BLOCK_BITS <= size <= 1 << 32:
            raise ValueError(f"a filter has a power of two bits from 512 to 2**32, not {size}")
        self._bits = bits
        self._blocks = size // BLOCK_BITS - 1
        """A mask: blocks are numbered 0 to this."""
        self.capacity = size // BITS_PER_KEY
        """Keys it holds at its intended error rate; past that, "maybe" grows more common."""

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
        block, low, high, _ = _words(
            blake2b(_key(connection_id, native_id), digest_size=16).digest()
        )
        base = (block & self._blocks) * BLOCK_BITS
        bits = self._bits
        new = False
        for probe in (low & 511, low >> 9 & 511, high & 511, high >> 9 & 511):
            at = base + probe
            byte, bit = at >> 3, at & 7
            old = bits[byte]
            if not old >> bit & 1:
                bits[byte] = old | 1 << bit
                new = True
        self.count += 1
        return new
