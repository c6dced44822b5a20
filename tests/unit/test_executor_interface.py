"""The worker drives every executor kind through the one interface
(``backfill_core.executors.interface``): it never tells executor classes apart, and it
calls none of the per-shape read methods the interface replaced."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import ArrangementBackfill
from backfill_core.executors.chain import ChainBackfill
from backfill_core.executors.interface import ReadGrouping, VnodeRows, VnodeSummary
from backfill_core.executors.kinds import TableExecutor, as_backfill_executor, as_source_reads
from backfill_core.executors.messages import Barrier, ReadProvenanceError, SnapshotBatchRead
from backfill_core.executors.snapshot import SnapshotBackfill
from backfill_core.executors.source import SourceBackfill, SplitOffsets, SplitSummary
from tests.kit.executors import ACTOR, epoch, key_of

WORKER = Path(__file__).resolve().parents[2] / "spark_workers"
EXECUTOR_CLASSES = (
    "ArrangementBackfill",
    "CdcBackfill",
    "ChainBackfill",
    "SnapshotBackfill",
    "SourceBackfill",
)
OLD_METHODS = (
    "next_read",
    "next_spread_read",
    "next_batch_read",
    "next_batch_reads",
    "next_reads",
    "on_snapshot_rows",
    "on_read_summary",
    "on_batch_rows",
    "on_batch_summary",
    "on_backfill_rows",
    "on_backfill_summary",
)


def _worker_lines(pattern: re.Pattern[str]) -> list[str]:
    """``file:line`` of every line of the worker's modules (its packages too) matching."""
    return [
        f"{p.relative_to(WORKER)}:{i}"
        for p in sorted(WORKER.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_the_worker_never_tells_executor_classes_apart() -> None:
    classes = "|".join(EXECUTOR_CLASSES)
    assert _worker_lines(re.compile(rf"isinstance\([^)]*\b({classes})\b")) == []


def test_the_worker_reads_only_through_the_interface() -> None:
    assert _worker_lines(re.compile(rf"\.({'|'.join(OLD_METHODS)})\(")) == []


S = epoch(5)
# each kind, its first barrier, and whether its collect reports more than its vnodes
KINDS: dict[str, tuple[Callable[[], TableExecutor], Barrier, bool]] = {
    "arrangement": (
        lambda: ArrangementBackfill(ACTOR, [0, 1, 2], key_of),
        Barrier(EpochPair(epoch(0), epoch(1))),
        False,
    ),
    "chain": (
        lambda: ChainBackfill(ACTOR, [0, 1, 2], key_of),
        Barrier(EpochPair(epoch(0), epoch(1))),
        False,
    ),
    "snapshot": (
        lambda: SnapshotBackfill(ACTOR, [0, 1, 2], key_of, S),
        Barrier(EpochPair(0, 1 << 16)),  # phase 1 runs under fake epochs
        True,
    ),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_table_kind_plans_and_accounts_alike(kind: str) -> None:
    """The same calls on every kind: nothing to read before the first barrier; then
    each grouping covers the vnodes still to read, and a read accounted from its rows
    forwards them, one from its summary forwards nothing."""
    make, first, reports_more = KINDS[kind]
    e = as_backfill_executor(make())
    assert e.plan_reads(10) == []  # before the first barrier
    assert (e.report() != {}) is reports_more
    e.on_barrier(first, upstream_latest_epoch=None)
    assert [v for r in e.plan_reads(9, 3) for v, _ in r.starts] == [0, 1, 2]
    assert [r.starts for r in e.plan_reads(9, grouping=ReadGrouping.EACH)] == [
        ((v, None),) for v in (0, 1, 2)
    ]
    [one] = e.plan_reads(9, grouping=ReadGrouping.FIRST)
    assert one == SnapshotBatchRead(e.snapshot_epoch, ((0, None),), 9)
    assert e.account(one, VnodeRows([(0, (0, "a"))])) == [(0, "a")]  # short: vnode 0 ends
    [rest] = e.plan_reads(9, 1)
    assert [v for v, _ in rest.starts] == [1, 2]
    assert e.account(rest, VnodeSummary({1: (9, (9,))})) == []  # the limit: no vnode ends
    assert e.total_rows == 10 and not e.finished
    with pytest.raises(ReadProvenanceError):  # planned before it was accounted once
        e.account(rest, VnodeSummary({}))


def test_the_source_plans_and_accounts_over_splits() -> None:
    """The source's reads are one per split whatever the grouping (Kafka ranges share
    no limit), ``FIRST`` the first split with the whole budget."""
    ex = SourceBackfill(ACTOR, ["0", "1"])
    src = as_source_reads(ex)
    ex.on_backfill_info({"0": 9, "1": 9})
    assert src.plan_reads(10) == []  # before the first barrier
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1))), [])
    assert [r.split for r in src.plan_reads(10, 1)] == ["0", "1"]
    assert src.plan_reads(10, grouping=ReadGrouping.EACH) == src.plan_reads(10)
    [first] = src.plan_reads(10, grouping=ReadGrouping.FIRST)
    assert (first.split, first.limit) == ("0", 10)
    assert src.account(first, SplitOffsets([0, 1, 2])) == 3
    [second] = src.plan_reads(4)  # split 0 was read to its end in this epoch
    assert second.split == "1"
    assert src.account(second, SplitSummary(2, 1, 2)) == 0
    assert src.total_rows == 5 and not src.finished
