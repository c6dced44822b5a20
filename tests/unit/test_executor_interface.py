"""The worker drives every executor kind through the one interface
(``backfill_core.executors.interface``): it never tells executor classes apart, and it
calls none of the per-shape read methods the interface replaced."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import ArrangementBackfill
from backfill_core.executors.chain import ChainBackfill
from backfill_core.executors.interface import ReadGrouping, VnodeRows, VnodeSummary
from backfill_core.executors.kinds import as_backfill_executor
from backfill_core.executors.messages import Barrier, SnapshotBatchRead
from backfill_core.executors.snapshot import SnapshotBackfill
from tests.kit.executors import ACTOR, epoch, key_of

WORKER = Path(__file__).resolve().parents[2] / "spark_workers"
EXECUTOR_CLASSES = (
    "ArrangementBackfill",
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


def test_the_worker_never_tells_executor_classes_apart() -> None:
    classes = "|".join(EXECUTOR_CLASSES)
    pattern = re.compile(rf"isinstance\([^)]*\b({classes})\b")
    hits = [
        f"{p.name}:{i}"
        for p in sorted(WORKER.glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_the_worker_reads_only_through_the_interface() -> None:
    pattern = re.compile(rf"\.({'|'.join(OLD_METHODS)})\(")
    hits = [
        f"{p.name}:{i}"
        for p in sorted(WORKER.glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def _kinds() -> list[object]:
    return [
        ArrangementBackfill(ACTOR, [0, 1, 2], key_of),
        ChainBackfill(ACTOR, [0, 1, 2], key_of),
        SnapshotBackfill(ACTOR, [0, 1, 2], key_of, epoch(5)),
    ]


@pytest.mark.parametrize("ex", _kinds(), ids=lambda ex: type(ex).__name__)
def test_every_table_kind_plans_and_accounts_alike(ex: object) -> None:
    """The same calls on every kind: nothing to read before the first barrier; then
    each grouping covers the vnodes still to read, and a read accounted from its rows
    forwards them, one from its summary forwards nothing."""
    e = as_backfill_executor(ex)  # type: ignore[arg-type]
    assert e.plan_reads(10) == []  # before the first barrier
    # only the snapshot backfill reports more than its vnodes' progress
    assert (e.report() == {}) is not isinstance(e, SnapshotBackfill)
    first = Barrier(EpochPair(0, 1 << 16)) if isinstance(e, SnapshotBackfill) else None
    e.on_barrier(first or Barrier(EpochPair(epoch(0), epoch(1))), upstream_latest_epoch=None)
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
