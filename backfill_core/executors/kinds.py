"""Every executor kind against the one interface (``interface``), checked by mypy: a
kind that drifts from it fails the type check, not a worker at run time."""

from __future__ import annotations

from backfill_core.executors.arrangement import ArrangementBackfill
from backfill_core.executors.cdc import CdcBackfill, CdcWrite, ChunkRead, ChunkRows
from backfill_core.executors.chain import ChainBackfill
from backfill_core.executors.interface import BackfillExecutor, PlansReads
from backfill_core.executors.snapshot import SnapshotBackfill
from backfill_core.executors.source import OffsetRead, SourceBackfill, SplitOffsets, SplitSummary

TableExecutor = ArrangementBackfill | ChainBackfill | SnapshotBackfill
# a source backfill's reads are over splits; its barriers bring the shared source's rows
SourceReads = PlansReads[OffsetRead, SplitSummary | SplitOffsets, int]
# a CDC backfill's reads are primary-key chunks between WAL LSN watermarks; the change
# stream reaches it through ``on_changes``, its barriers bring nothing
CdcReads = PlansReads[ChunkRead, ChunkRows, list[CdcWrite]]


def as_backfill_executor(ex: TableExecutor) -> BackfillExecutor:
    return ex


def as_source_reads(ex: SourceBackfill) -> SourceReads:
    return ex


def as_cdc_reads(ex: CdcBackfill) -> CdcReads:
    return ex
