"""The one interface every backfill executor kind offers the worker
(``docs/architecture.md#the-contract``): barriers in, reads planned within the epoch's
budget, each read accounted from its rows or from a summary of them.

The worker drives every kind through these members alone, so that its loop never
tells kinds apart; what differs between kinds (a fixed snapshot, a log store, the
collect's extra report) stays inside the executor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from backfill_core.changes import Row, RowChange
from backfill_core.executors.messages import Barrier, BarrierOutput, ChangeRange, SnapshotBatchRead


class ReadGrouping(StrEnum):
    """How ``plan_reads`` lays the vnodes (splits) still to read out over reads."""

    # up to ``parts`` contiguous groups, each read under one limit (``flow.split_batches``)
    GROUPS = "groups"
    # one read per vnode (split) still to read, the budget shared (``flow.spread_reads``)
    EACH = "each"
    # one read of the first vnode (split) still to read, with the whole budget
    FIRST = "first"


@dataclass(frozen=True, slots=True)
class VnodeSummary:
    """A read whose rows were handled elsewhere (a statement or Spark task wrote them):
    per vnode, ``(rows read, last key read)``; a vnode missing read nothing."""

    per_vnode: Mapping[int, tuple[int, Row | None]]

    @property
    def rows(self) -> int:
        return sum(count for count, _ in self.per_vnode.values())


@dataclass(frozen=True, slots=True)
class VnodeRows:
    """A read's rows, ``(vnode, row)``: each vnode's in key order, the vnodes' in any
    order or interleaved (as Postgres runs a group's branches)."""

    rows: Sequence[tuple[int, Row]]


VnodeReadResult = VnodeSummary | VnodeRows

ReadT = TypeVar("ReadT")
ResultT_contra = TypeVar("ResultT_contra", contravariant=True)
ForwardT_co = TypeVar("ForwardT_co", covariant=True)


class PlansReads(Protocol[ReadT, ResultT_contra, ForwardT_co]):
    """The read side every kind shares: plan the reads of the open epoch, account each.

    ``plan_reads`` returns the reads to run now, within ``max_rows`` and the epoch's
    budget (empty: nothing to read now). The reads of one plan are independent and
    may run in parallel; each is accounted once with ``account``, before the barrier
    that closes the epoch they were planned in (a read of another epoch or another
    start is refused, ``ReadProvenanceError``). ``account`` returns what to forward:
    the rows to write for a table read's rows, nothing for a summary.
    """

    @property
    def finished(self) -> bool: ...
    @property
    def total_rows(self) -> int: ...
    @property
    def budget(self) -> int | None: ...
    @property
    def paused(self) -> bool: ...
    @property
    def open_epoch(self) -> int: ...

    def plan_reads(
        self, max_rows: int, parts: int = 1, *, grouping: ReadGrouping = ReadGrouping.GROUPS
    ) -> list[ReadT]: ...

    def account(self, read: ReadT, result: ResultT_contra) -> ForwardT_co: ...

    def progress_rows(self) -> list[dict[str, Any]]: ...

    def report(self) -> dict[str, Any]: ...


class BackfillExecutor(PlansReads[SnapshotBatchRead, VnodeReadResult, list[Row]], Protocol):
    """A table backfill (arrangement, chain, snapshot): reads are groups of vnodes
    (``SnapshotBatchRead``; a group of one vnode reads that vnode alone), barriers
    bring the upstream's changes the executor asked for (``changes_needed``).

    ``upstream_latest_epoch``: the latest epoch the upstream had sealed when the meta
    injected the barrier; kinds that do not pace themselves on it ignore it.
    ``report``: what a collect reports besides ``progress_rows`` (empty: nothing).
    """

    @property
    def vnodes(self) -> tuple[int, ...]: ...
    @property
    def snapshot_epoch(self) -> int: ...

    def changes_needed(self, barrier: Barrier) -> ChangeRange | None: ...

    def on_barrier(
        self,
        barrier: Barrier,
        changes: Sequence[RowChange] = (),
        *,
        upstream_latest_epoch: int | None = None,
    ) -> BarrierOutput: ...
