"""The closed set of messages an executor sees, and what it hands back.

Barriers come from the meta; snapshot rows and upstream changes are read by the runtime
on the executor's request. Executors never do I/O and never read the clock: a
barrier's epochs carry the time (rate limits are derived from their physical times).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from backfill_core.changes import Row, RowChange
from backfill_core.epoch import EpochPair, physical_time


class BarrierKind(StrEnum):
    INITIAL = "initial"
    BARRIER = "barrier"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True, slots=True)
class Mutation:
    """What a barrier changes; parsed from the meta's JSON."""

    add: frozenset[int] = frozenset()
    stop: frozenset[int] = frozenset()
    # the actors a pause / resume applies to: those of the one job it was asked for (a
    # graph runs many jobs, each paused on its own)
    pause: frozenset[int] = frozenset()
    resume: frozenset[int] = frozenset()
    throttle: Mapping[int, int | None] = field(
        default_factory=dict
    )  # actor -> rows/s (None: no limit)
    # split change: actor -> every split it owns from now on (None: no split change)
    splits: Mapping[int, tuple[str, ...]] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Mutation | None:
        if not data:
            return None
        return cls(
            add=frozenset(int(a) for a in data.get("add", ())),
            stop=frozenset(int(a) for a in data.get("stop", ())),
            pause=frozenset(int(a) for a in data.get("pause") or ()),
            resume=frozenset(int(a) for a in data.get("resume") or ()),
            throttle={
                int(k): (None if v is None else int(v))
                for k, v in (data.get("throttle") or {}).items()
            },
            splits=None
            if data.get("splits") is None
            else {int(a): tuple(str(s) for s in ss) for a, ss in data["splits"].items()},
        )


@dataclass(frozen=True, slots=True)
class Barrier:
    epoch: EpochPair
    kind: BarrierKind = BarrierKind.CHECKPOINT
    mutation: Mutation | None = None

    @property
    def is_checkpoint(self) -> bool:
        return self.kind is not BarrierKind.BARRIER

    @property
    def elapsed_ms(self) -> int:
        """Physical time the closing epoch lasted (what a rate limit is applied over)."""
        if self.epoch.prev == 0:
            return 0
        return max(0, physical_time(self.epoch.curr) - physical_time(self.epoch.prev))


@dataclass(frozen=True, slots=True)
class SnapshotRead:
    """Read up to ``limit`` rows of ``vnode`` at ``epoch`` after ``after`` (pk, exclusive)."""

    vnode: int
    epoch: int
    after: Row | None
    limit: int


@dataclass(frozen=True, slots=True)
class SnapshotBatchRead:
    """Several vnodes read with one shared row limit (one round trip): each vnode's
    first rows after its position, ``limit`` rows at most in all, the vnodes read in any
    order or interleaved (``flow.account_batch`` accounts for them so).
    """

    epoch: int
    starts: tuple[tuple[int, Row | None], ...]  # (vnode, after pk), the order preferred
    limit: int


@dataclass(frozen=True, slots=True)
class ChangeRange:
    """The upstream's net changes in epochs ``(after, upto]`` of ``vnodes``."""

    after: int
    upto: int
    vnodes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BarrierOutput:
    """What the runtime does at a barrier: write ``emit`` at ``write_epoch``, then collect."""

    write_epoch: int
    emit: list[RowChange]
    progress: dict[str, Any]
    rows: int
    finished: bool


class ReadProvenanceError(ValueError):
    """A read came back for another epoch or start position than the executor asked for."""
