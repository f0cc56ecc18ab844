"""Duplicate suppression with max_seen + complement (seed 003, ``is_first_time``).

Message ids from one sender on one channel increase monotonically and most messages
arrive, so instead of the set of every id seen we keep the highest id seen and the
complement: the ids below it not seen yet. ``is_first_time`` is the seed's algorithm,
verbatim. ``SeenSet`` is the same algorithm with the complement stored as sorted
half-open intervals, so that a jump in ids (a garbage frame claiming id 10**15, a burst
of losses) costs one interval, not one entry per missing id: memory is proportional to
the number of gaps, which stays small when most messages arrive.
"""

from __future__ import annotations

import bisect

from homing.errors import InvalidArgument


def is_first_time(current: int, max_seen: int, complement: set[int]) -> tuple[bool, int, set[int]]:
    """The seed's reference algorithm: (first_time, max_seen, complement)."""
    first_time = False
    if current > max_seen:
        for i in range(max_seen + 1, current):
            complement.add(i)
        max_seen = current
        first_time = True
    else:
        if current in complement:
            complement.remove(current)
            first_time = True
    return first_time, max_seen, complement


class SeenSet:
    """The ids seen from one sender: ``max_seen`` and the complement as intervals.

    Ids start at 1 (``max_seen == 0`` means nothing seen). ``peek`` answers without
    changing anything, so a receiver can run a handler first and ``mark`` the id only
    once the handler's transaction commits; ``is_first_time`` does both, like the seed.
    """

    __slots__ = ("_his", "_los", "max_seen")

    def __init__(self, max_seen: int = 0, gaps: list[tuple[int, int]] | None = None) -> None:
        self.max_seen = max_seen
        self._los: list[int] = []
        self._his: list[int] = []  # exclusive ends
        for lo, hi in gaps or []:
            if not (1 <= lo < hi <= max_seen + 1) or (self._his and lo <= self._his[-1]):
                raise InvalidArgument(
                    f"bad complement interval [{lo}, {hi}) for max_seen {max_seen}"
                )
            self._los.append(lo)
            self._his.append(hi)

    def peek(self, current: int) -> bool:
        """True if ``current`` has not been seen (nothing is changed)."""
        if current > self.max_seen:
            return True
        i = bisect.bisect_right(self._los, current) - 1
        return i >= 0 and current < self._his[i]

    def mark(self, current: int) -> bool:
        """Record ``current`` as seen; True if it was not seen before."""
        if current < 1:
            raise InvalidArgument(f"message ids start at 1, got {current}")
        if current > self.max_seen:
            if current > self.max_seen + 1:
                lo = self.max_seen + 1
                if self._his and self._his[-1] == lo:  # extend the last gap
                    self._his[-1] = current
                else:
                    self._los.append(lo)
                    self._his.append(current)
            self.max_seen = current
            return True
        i = bisect.bisect_right(self._los, current) - 1
        if i < 0 or current >= self._his[i]:
            return False
        lo, hi = self._los[i], self._his[i]
        if hi - lo == 1:
            del self._los[i]
            del self._his[i]
        elif current == lo:
            self._los[i] = lo + 1
        elif current == hi - 1:
            self._his[i] = hi - 1
        else:
            self._his[i] = current
            self._los.insert(i + 1, current + 1)
            self._his.insert(i + 1, hi)
        return True

    def grows(self, current: int) -> bool:
        """True if marking ``current`` would add a complement interval (a new gap above
        ``max_seen``, or an id in the middle of a gap splitting it in two)."""
        if current > self.max_seen:
            return current > self.max_seen + 1
        i = bisect.bisect_right(self._los, current) - 1
        return i >= 0 and self._los[i] < current < self._his[i] - 1

    def is_first_time(self, current: int) -> bool:
        """The seed's ``is_first_time``: check and record in one step."""
        return self.mark(current)

    @property
    def gaps(self) -> list[tuple[int, int]]:
        """The complement as half-open intervals ``[lo, hi)``."""
        return list(zip(self._los, self._his, strict=True))

    @property
    def interval_count(self) -> int:
        """How many intervals the complement takes: the memory this set uses."""
        return len(self._los)

    def unseen_count(self) -> int:
        """How many ids below ``max_seen`` are still unseen."""
        return sum(h - lo for lo, h in zip(self._los, self._his, strict=True))

    def complement(self) -> set[int]:
        """The complement as a plain set (for tests and small gaps only)."""
        return {i for lo, h in self.gaps for i in range(lo, h)}

    def snapshot(self) -> dict[int, int]:
        """The gaps as ``{lo: hi}``, to ``diff`` against after a batch."""
        return dict(zip(self._los, self._his, strict=True))

    def diff(self, before: dict[int, int]) -> tuple[list[int], list[tuple[int, int]]]:
        """What changed since ``before`` (a ``snapshot``): the ``lo`` of gaps gone, and the
        gaps new or changed. A batch usually fills a few gaps and opens a few: the store
        writes those rows, not the whole complement."""
        now = self.snapshot()
        gone = [lo for lo in before if lo not in now]
        changed = [(lo, hi) for lo, hi in now.items() if before.get(lo) != hi]
        return gone, changed

    def encode(self) -> str:
        """Text form for the store: ``"lo-hi,lo-hi"`` (half-open)."""
        return ",".join(f"{lo}-{h}" for lo, h in self.gaps)

    @classmethod
    def decode(cls, max_seen: int, text: str) -> SeenSet:
        gaps: list[tuple[int, int]] = []
        for part in (text or "").split(","):
            if part:
                lo, _, hi = part.partition("-")
                gaps.append((int(lo), int(hi)))
        return cls(max_seen, gaps)

    def __repr__(self) -> str:
        return f"SeenSet(max_seen={self.max_seen}, gaps={self.gaps})"
