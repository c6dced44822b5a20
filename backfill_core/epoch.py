"""Epochs as in the seeds: milliseconds since 2021-04-01T00:00:00Z shifted left 16 bits.

The low 16 bits break ties between epochs taken in the same millisecond. The clock is
always injected (``now_unix_ms``); nothing here reads the wall clock.
"""

from __future__ import annotations

from dataclasses import dataclass

EPOCH_ORIGIN_UNIX_MS = 1_617_235_200_000  # 2021-04-01T00:00:00Z
EPOCH_PHYSICAL_SHIFT = 16
EPOCH_SPILL_MASK = (1 << EPOCH_PHYSICAL_SHIFT) - 1
MAX_EPOCH = (1 << 63) - 1  # stored as a Postgres bigint


class InvalidEpoch(ValueError):
    pass


class Epoch(int):
    """A strictly increasing u64 (stored as bigint); 0 is invalid."""

    def __new__(cls, value: int) -> Epoch:
        if value <= 0 or value > MAX_EPOCH:
            raise InvalidEpoch(f"epoch must be in 1..{MAX_EPOCH}, got {value}")
        return super().__new__(cls, value)

    @classmethod
    def from_physical_time(cls, physical_ms: int) -> Epoch:
        """The first epoch of a millisecond counted from the origin."""
        return cls(physical_ms << EPOCH_PHYSICAL_SHIFT)

    @classmethod
    def from_unix_ms(cls, unix_ms: int) -> Epoch:
        return cls.from_physical_time(unix_ms - EPOCH_ORIGIN_UNIX_MS)

    @property
    def physical_time(self) -> int:
        """Milliseconds since the origin."""
        return int(self) >> EPOCH_PHYSICAL_SHIFT

    @property
    def unix_ms(self) -> int:
        return self.physical_time + EPOCH_ORIGIN_UNIX_MS

    def next(self, now_unix_ms: int) -> Epoch:
        """The epoch after this one at wall time ``now_unix_ms``.

        Strictly greater than ``self`` even when the clock stalls or goes back: then
        the tie-breaking low bits advance instead.
        """
        candidate = (now_unix_ms - EPOCH_ORIGIN_UNIX_MS) << EPOCH_PHYSICAL_SHIFT
        if candidate > self:
            return Epoch(candidate)
        return Epoch(int(self) + 1)

    def __repr__(self) -> str:
        return f"Epoch({int(self)})"


def physical_time(epoch: int) -> int:
    return epoch >> EPOCH_PHYSICAL_SHIFT


def lag_ms(latest: int, consumed: int) -> int:
    """Distance between two epochs in milliseconds of physical time (never negative)."""
    return max(0, physical_time(latest) - physical_time(consumed))


@dataclass(frozen=True, slots=True)
class EpochPair:
    """A barrier closes ``prev`` and opens ``curr``; data before it belongs to ``prev``."""

    prev: int
    curr: int

    def __post_init__(self) -> None:
        if self.prev < 0 or self.curr <= 0:
            raise InvalidEpoch(f"epochs must be positive: prev={self.prev} curr={self.curr}")
        if self.curr <= self.prev:
            raise InvalidEpoch(f"curr must be after prev: prev={self.prev} curr={self.curr}")

    @classmethod
    def first(cls, curr: int) -> EpochPair:
        """The pair of an initial barrier: nothing is closed before the first epoch."""
        return cls(0, curr)
