"""Sets of byte ranges: which bytes of a cache file are present, which were written.

A ``RangeSet`` keeps sorted, disjoint, non-adjacent half-open ranges ``[start, end)``;
``add`` merges, ``remove`` cuts, ``missing`` answers what a read or an upload still needs.
Operations are O(log n + k) for k ranges touched (bisect on the starts). ``blocks`` names
the fixed-size blocks a range touches (the data cache's unit of fetching and eviction).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Iterator


class RangeSet:
    __slots__ = ("_starts", "_ends")

    def __init__(self, ranges: "list[tuple[int, int]] | RangeSet" = ()):
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in ranges:
            self.add(start, end)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends)

    def __len__(self) -> int:
        return len(self._starts)

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __eq__(self, other) -> bool:
        return isinstance(other, RangeSet) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"RangeSet({list(self)!r})"

    def copy(self) -> "RangeSet":
        new = RangeSet()
        new._starts, new._ends = self._starts[:], self._ends[:]
        return new

    @property
    def total(self) -> int:
        """How many bytes the set covers."""
        return sum(e - s for s, e in self)

    def add(self, start: int, end: int) -> None:
        if start >= end:
            return
        # every range that overlaps or touches [start, end) merges into it
        i = bisect_left(self._ends, start)
        j = bisect_right(self._starts, end)
        if i < j:
            start = min(start, self._starts[i])
            end = max(end, self._ends[j - 1])
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def remove(self, start: int, end: int) -> None:
        if start >= end:
            return
        i = bisect_right(self._ends, start)
        j = bisect_left(self._starts, end)
        if i >= j:
            return
        keep_s, keep_e = [], []
        if self._starts[i] < start:
            keep_s.append(self._starts[i])
            keep_e.append(start)
        if self._ends[j - 1] > end:
            keep_s.append(end)
            keep_e.append(self._ends[j - 1])
        self._starts[i:j] = keep_s
        self._ends[i:j] = keep_e

    def covers(self, start: int, end: int) -> bool:
        """Every byte of ``[start, end)`` is in the set (an empty range always is)."""
        if start >= end:
            return True
        i = bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def intersects(self, start: int, end: int) -> bool:
        """Some byte of ``[start, end)`` is in the set."""
        if start >= end:
            return False
        i = bisect_right(self._ends, start)
        return i < len(self._starts) and self._starts[i] < end

    def missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` not in the set, in order."""
        gaps = []
        i = bisect_right(self._ends, start)
        pos = start
        while pos < end and i < len(self._starts) and self._starts[i] < end:
            if self._starts[i] > pos:
                gaps.append((pos, self._starts[i]))
            pos = max(pos, self._ends[i])
            i += 1
        if pos < end:
            gaps.append((pos, end))
        return gaps

    def truncate(self, size: int) -> None:
        """Drop everything at or beyond ``size``."""
        if self._starts and self._ends[-1] > size:
            self.remove(size, self._ends[-1])


def blocks(start: int, end: int, block_size: int) -> range:
    """The numbers of the blocks of ``block_size`` bytes that [start, end) touches."""
    b = block_size
    return range(start // b, (end + b - 1) // b) if start < end else range(0)
