"""A compact int -> int table for a million rollout keys (and the line digests it is keyed by)."""

from __future__ import annotations

import hashlib
from array import array


class IntTable:
    """Non-negative int keys (< 2**63) → int values, in two flat arrays (open addressing).

    A Python dict or set of a million ints costs 60-120 MB of objects; this costs 32 MB, which
    keeps the pre-pass and resume of a million-row collection well inside its memory budget.
    """

    _MULTIPLIER = 0x9E3779B97F4A7C15  # Fibonacci hashing spreads keys whose low bits repeat

    def __init__(self) -> None:
        self._bits = 10
        self._keys = array("Q", bytes(8 << self._bits))  # key + 1; 0 marks a free slot
        self._values = array("q", bytes(8 << self._bits))
        self._size = 0

    def _find(self, stored: int) -> int:
        keys, mask = self._keys, (1 << self._bits) - 1
        slot = ((stored * self._MULTIPLIER) & 0xFFFFFFFFFFFFFFFF) >> (64 - self._bits)
        while keys[slot] and keys[slot] != stored:
            slot = (slot + 1) & mask
        return slot

    def setdefault(self, key: int, value: int) -> int:
        """The value stored for ``key``, storing ``value`` first if the key is new."""
        slot = self._find(key + 1)
        if self._keys[slot]:
            return int(self._values[slot])
        self._keys[slot], self._values[slot] = key + 1, value
        self._size += 1
        if self._size * 2 > len(self._keys):
            self._grow()
        return value

    def add(self, key: int) -> None:
        """Store ``key`` (with value 0) if it is new."""
        self.setdefault(key, 0)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and bool(self._keys[self._find(key + 1)])

    def __len__(self) -> int:
        return self._size

    def _grow(self) -> None:
        old_keys, old_values = self._keys, self._values
        self._bits += 1
        self._keys, self._values = array("Q", bytes(8 << self._bits)), array("q", bytes(8 << self._bits))
        for stored, value in zip(old_keys, old_values, strict=True):
            if stored:
                slot = self._find(stored)
                self._keys[slot], self._values[slot] = stored, value


def line_digest(line: bytes) -> int:
    """A 63-bit digest of a line's bytes (identical lines, identical digests)."""
    return int.from_bytes(hashlib.blake2b(line, digest_size=8).digest(), "little") >> 1
