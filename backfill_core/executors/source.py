"""Source backfill (seed: ``source_backfill_executor.rs``), decided once per epoch.

Splits are Kafka partitions (ids are strings), offsets are ints. The shared source
advances at every barrier: the barrier that opens epoch ``c`` comes with the upstream
rows of ``c`` (the offsets the source passed in ``c``). They are handled first, as the
seed prefers upstream; then the backfill side reads the partitions from Kafka during
``c``; everything visible in ``c`` is written at ``c``. The barrier that closes ``c``
reports the progress as of the end of ``c``.

Per split: ``Backfilling(offset | None) -> SourceCachingUp(offset) -> Finished``, with
``target_offset`` from the partition's latest offset (``on_backfill_info``) or the
latest upstream offset seen while backfilling. ``on_upstream_row`` and
``on_backfill_row`` are the seed's two decisions; ``on_backfill_end`` is one the seed
lacks (below); everything else is bookkeeping.

Offsets: a split's ``offset`` and ``target_offset`` are inclusive (the last offset
backfilled, the last offset that existed: high watermark - 1), as in the seed, and
``SourceCachingUp(o)`` drops upstream rows at or below ``o``. The target need not be a
message: the offsets below the high watermark may end in transaction markers (or
messages compaction removed), which no reader returns. A read that reaches past the
target without a row at or beyond it (``end``: the reader saw every message below it)
proves that the backfill has emitted everything up to the target, so the split caches
up from the target, ``SourceCachingUp(target)``, instead of waiting for a newer
upstream message to move the target onto a message.

A second decision the seed lacks, ``on_source_end``: every barrier also says where the
shared source now is in each split (the end of its offsets in the epoch, exclusive). A
split caching up from ``o`` is finished once the source is past ``o``, even when no
message at or beyond ``o`` came with it. In the seed such a split waits for the next
message: when the backfill stops at an offset the source had already delivered (the
target the upstream rows set) and the topic then goes quiet, the split would stay
``SourceCachingUp`` (and the actor in the backfill stage) until someone writes again.

The actor reports finish once every split is ``SourceCachingUp`` or ``Finished``, but
stays in the backfill stage until every split of the job (on all actors) is
``Finished``: until then a split migrated in may still need a backfill.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from backfill_core.executors.arrangement import Phase, epoch_budget
from backfill_core.executors.flow import apply_flow_mutation, check_planned_now
from backfill_core.executors.interface import ReadGrouping
from backfill_core.executors.messages import Barrier, ReadProvenanceError

__all__ = [
    "OffsetRead",
    "Phase",
    "SourceBackfill",
    "SourceBarrierOutput",
    "SplitOffsets",
    "SplitSummary",
    "SplitProgress",
    "SplitState",
    "on_backfill_end",
    "on_backfill_row",
    "on_source_end",
    "on_upstream_row",
    "should_report_finished",
    "split_key",
    "split_order",
    "split_visible_prefix",
]


class SplitState(StrEnum):
    BACKFILLING = "backfilling"
    SOURCE_CACHING_UP = "source_caching_up"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class SplitProgress:
    """One split's state; ``offset`` is the last offset backfilled (None: not started)."""

    state: SplitState = SplitState.BACKFILLING
    offset: int | None = None  # None while Finished
    num_consumed_rows: int = 0
    target_offset: int | None = None
    # messages that are not rows (the source's ``on_error: skip``), and the last of them
    skipped: int = 0
    last_skipped_offset: int | None = None

    def __post_init__(self) -> None:
        if self.state is SplitState.SOURCE_CACHING_UP and self.offset is None:
            raise ValueError("a split caching up needs the offset the backfill stopped at")
        if self.state is SplitState.FINISHED and self.offset is not None:
            raise ValueError("a finished split has no offset")
        if self.num_consumed_rows < 0:
            raise ValueError("num_consumed_rows must not be negative")

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SplitProgress:
        """Parse one entry of ``progress_rows`` (committed progress)."""

        def opt(v: Any) -> int | None:
            return None if v is None else int(v)

        return cls(
            SplitState(row["state"]),
            opt(row.get("offset")),
            int(row.get("num_consumed_rows", 0)),
            opt(row.get("target_offset")),
            int(row.get("skipped", 0)),
            opt(row.get("last_skipped_offset")),
        )


NEW_SPLIT = SplitProgress(SplitState.FINISHED)  # added to the source after the job began


@dataclass(frozen=True, slots=True)
class OffsetRead:
    """Read up to ``limit`` rows of ``split`` from ``start`` (inclusive; None: earliest),
    planned in the open ``epoch`` (its visible rows are written at it)."""

    split: str
    epoch: int
    start: int | None
    target: int | None  # the split's target when planned (Spark stops after the first row >= it)
    limit: int


@dataclass(frozen=True, slots=True)
class SplitOffsets:
    """A read's rows, by their offsets (ascending from the read's start); ``end``: the
    reader saw every message of the split below it (``on_backfill_end``)."""

    offsets: Sequence[int]
    end: int | None = None


@dataclass(frozen=True, slots=True)
class SplitSummary:
    """A read whose rows were handled elsewhere (a Spark task wrote the ``visible``
    leading ones of the ``count`` it read, the last at ``last_offset``).

    ``last_visible`` (the last visible offset) is needed only when rows after it were
    read too; the Spark path stops at the first row at or beyond the target. ``end``
    as in ``SplitOffsets``."""

    count: int
    last_offset: int | None
    visible: int
    last_visible: int | None = None
    end: int | None = None


@dataclass(frozen=True, slots=True)
class SourceBarrierOutput:
    """Write ``upstream[i] for i in emit`` at ``write_epoch``, then collect."""

    emit: list[int]
    write_epoch: int
    progress: dict[str, Any]
    rows: int
    finished: bool


def on_upstream_row(p: SplitProgress, offset: int) -> tuple[SplitProgress, bool]:
    """The seed's ``handle_upstream_row``: the split's new state and the row's visibility."""
    state, visible = p.state, False
    if p.state is SplitState.BACKFILLING:
        if p.offset is None or p.offset < offset:
            pass  # the backfill has not reached this row yet: it will read it itself
        elif p.offset == offset:
            state = SplitState.FINISHED  # both sides met exactly
        else:
            state = SplitState.SOURCE_CACHING_UP  # backfill is ahead: drop upstream until it
    elif p.state is SplitState.SOURCE_CACHING_UP:
        assert p.offset is not None
        if p.offset < offset:
            # the source skipped the backfill's last row (e.g. compaction): this one is new
            state, visible = SplitState.FINISHED, True
        elif p.offset == offset:
            state = SplitState.FINISHED
    else:
        visible = True
    target = offset if state is SplitState.BACKFILLING else p.target_offset
    new_offset = None if state is SplitState.FINISHED else p.offset
    return _moved(p, state, new_offset, p.num_consumed_rows, target), visible


def on_backfill_row(p: SplitProgress, offset: int) -> tuple[SplitProgress, bool]:
    """The seed's ``handle_backfill_row``: every row counts, only rows while backfilling show."""
    consumed = p.num_consumed_rows + 1
    if p.state is not SplitState.BACKFILLING:
        return replace(p, num_consumed_rows=consumed), False
    if p.target_offset is not None and offset >= p.target_offset:
        # reached what the source had: stop and let the source catch up to it
        caching_up = SplitState.SOURCE_CACHING_UP
        return _moved(p, caching_up, offset, consumed, p.target_offset), True
    return _moved(p, SplitState.BACKFILLING, offset, consumed, p.target_offset), True


def _moved(
    p: SplitProgress, state: SplitState, offset: int | None, consumed: int, target: int | None
) -> SplitProgress:
    """``p`` at a new state and offset, its skipped messages kept (a constructor call:
    this runs per message, where ``dataclasses.replace`` costs a few times more)."""
    return SplitProgress(state, offset, consumed, target, p.skipped, p.last_skipped_offset)


def on_backfill_end(p: SplitProgress, end: int | None) -> SplitProgress:
    """A read saw every message of the split below ``end`` (exclusive; None: unknown).
    Past the target with the split still backfilling, the offsets after its last row up
    to the target hold no message (markers, aborted or compacted ones): the backfill is
    done there, the source catches up from the target."""
    if (
        p.state is SplitState.BACKFILLING
        and p.target_offset is not None
        and end is not None
        and end > p.target_offset
    ):
        return replace(p, state=SplitState.SOURCE_CACHING_UP, offset=p.target_offset)
    return p


def on_source_end(p: SplitProgress, end: int) -> SplitProgress:
    """The shared source delivered every message of the split below ``end`` (exclusive).
    Caching up from ``offset``, with the source past it: the upstream rows up to the
    offset were dropped as the backfill's, any newer one would have finished the split
    already, so none is missing: the split is finished (nothing to emit)."""
    if p.state is SplitState.SOURCE_CACHING_UP and p.offset is not None and end > p.offset:
        return replace(p, state=SplitState.FINISHED, offset=None)
    return p


def split_visible_prefix(offsets: Sequence[int], p: SplitProgress) -> int:
    """How many leading ``offsets`` (read after ``p``) are visible: up to and including the
    first at or beyond the target, none unless the split is backfilling."""
    if p.state is not SplitState.BACKFILLING:
        return 0
    if p.target_offset is None:
        return len(offsets)
    for i, o in enumerate(offsets):
        if o >= p.target_offset:
            return i + 1
    return len(offsets)


def should_report_finished(progress: Mapping[str, SplitProgress]) -> bool:
    """Finish is reported once no split needs more backfill rows (the rest is the source's)."""
    return all(p.state is not SplitState.BACKFILLING for p in progress.values())


def split_key(split: str) -> tuple[int, str]:
    """The sort key of a split id, wherever splits are listed (control plane and worker):
    partition numbers numerically, any other id after them."""
    return (int(split), split) if split.isdigit() else (1 << 62, split)


def split_order(splits: Iterable[str]) -> list[str]:
    """Splits in ``split_key`` order."""
    return sorted(splits, key=split_key)


class SourceBackfill:
    def __init__(
        self,
        actor_id: int,
        splits: Iterable[str],
        *,
        rate_limit: int | None = None,
        paused: bool = False,
        restore: Mapping[str, SplitProgress] | None = None,
    ) -> None:
        self.actor_id = actor_id
        self.rate_limit = rate_limit
        self.paused = paused
        restore = restore or {}
        self.progress: dict[str, SplitProgress] = {
            s: restore.get(s, SplitProgress()) for s in split_order(set(splits))
        }
        # the backfill stage is left only at a barrier that sees every split of the job finished
        self.phase = Phase.BACKFILLING
        self.started = False
        self.open_epoch = 0
        self.budget: int | None = 0
        self.exhausted: set[str] = set()  # splits read to their end in the open epoch
        self.epoch_rows = 0

    @property
    def total_rows(self) -> int:
        return sum(p.num_consumed_rows for p in self.progress.values())

    @property
    def finished(self) -> bool:
        """What the next barrier reports: no split needs more backfill rows."""
        return self.phase is Phase.FORWARDING or (
            self.started and should_report_finished(self.progress)
        )

    def unfinished_splits(self) -> list[tuple[str, int | None]]:
        """``(split, last offset backfilled)`` of the splits still backfilling (reads resume
        after the offset): the ones whose backfill info ``on_backfill_info`` wants."""
        return [
            (s, p.offset) for s, p in self.progress.items() if p.state is SplitState.BACKFILLING
        ]

    def on_backfill_info(self, info: Mapping[str, int | None]) -> None:
        """Latest existing offset per split (high watermark - 1), fetched before the first
        barrier; None: the partition is empty, nothing to backfill (pass the offset, not
        None, for a split resumed at its latest offset). Only backfilling splits take it."""
        if self.started:
            raise ValueError("backfill info comes before the first barrier")
        unknown = set(info) - set(self.progress)
        if unknown:
            raise ValueError(f"backfill info for splits not owned: {sorted(unknown)}")
        for s, latest in info.items():
            p = self.progress[s]
            if p.state is not SplitState.BACKFILLING:
                continue
            if latest is None:
                self.progress[s] = replace(p, state=SplitState.FINISHED, offset=None)
            else:
                self.progress[s] = replace(p, target_offset=latest)

    # barriers -------------------------------------------------------------

    def on_barrier(
        self,
        barrier: Barrier,
        upstream: Sequence[tuple[str, int]],
        *,
        others_finished: bool = False,
        committed: Mapping[str, SplitProgress] | None = None,
        source_ends: Mapping[str, int] | None = None,
    ) -> SourceBarrierOutput:
        """Report the closing epoch, apply the mutation, then open the next epoch with its
        upstream rows. ``others_finished``: every split of the job on the other actors is
        ``Finished`` in committed progress; ``committed``: that progress, for splits
        migrating in; ``source_ends``: split -> the end (exclusive) of the source's
        offsets in the epoch opened, past its upstream rows (``on_source_end``)."""
        forwarding = self.phase is Phase.FORWARDING
        finished = forwarding or (self.started and should_report_finished(self.progress))
        out_progress = {"splits": self.progress_rows()}
        rows = self.epoch_rows if self.started else 0

        # everything that can fail is checked before any state changes
        mutation = barrier.mutation
        progress = self.progress
        if mutation is not None and mutation.splits is not None:
            target = mutation.splits.get(self.actor_id)
            if target is not None:
                progress = self._split_change(target, committed or {})
        _check_upstream(upstream, progress, source_ends or {})

        self.paused, self.rate_limit = apply_flow_mutation(
            self.actor_id, mutation, self.paused, self.rate_limit
        )
        self.progress = progress
        # the seed checks the whole job only at barriers reporting finish
        if (
            not forwarding
            and finished
            and others_finished
            and all(p.state is SplitState.FINISHED for p in progress.values())
        ):
            self.phase = Phase.FORWARDING

        emit = []
        for i, (s, offset) in enumerate(upstream):
            self.progress[s], visible = on_upstream_row(self.progress[s], offset)
            if visible:
                emit.append(i)
        for s, end in (source_ends or {}).items():
            self.progress[s] = on_source_end(self.progress[s], end)

        self.started = True
        self.open_epoch = barrier.epoch.curr
        self.budget = epoch_budget(self.rate_limit, self.paused, barrier.elapsed_ms, self.budget)
        self.exhausted = set()
        self.epoch_rows = 0
        return SourceBarrierOutput(emit, barrier.epoch.curr, out_progress, rows, finished)

    def _split_change(
        self, target: Iterable[str], committed: Mapping[str, SplitProgress]
    ) -> dict[str, SplitProgress]:
        """The seed's ``update_state_if_changed``: kept splits keep their state, a split
        migrated in takes its committed state, a split new to the job needs no backfill.
        A split no longer listed is trimmed: it leaves the progress (the reports from the
        next barrier on, ``total_rows``); its committed row goes at the meta's next commit
        unless another actor of the job owns it now (``service.meta.barriers``)."""
        out: dict[str, SplitProgress] = {}
        for s in split_order(set(target)):
            if s in self.progress:
                out[s] = self.progress[s]
            elif s in committed:
                p = committed[s]
                if self.phase is Phase.FORWARDING and p.state is not SplitState.FINISHED:
                    raise ValueError(f"split {s} migrated in unfinished after the backfill: {p}")
                out[s] = p
            else:
                out[s] = NEW_SPLIT
        return out

    # backfill side ----------------------------------------------------------

    def plan_reads(
        self, max_rows: int, parts: int = 1, *, grouping: ReadGrouping = ReadGrouping.GROUPS
    ) -> list[OffsetRead]:
        """One read per split still backfilling and not read to its end in this epoch,
        sharing ``max_rows`` (and the budget) as evenly as whole rows allow (``FIRST``:
        the first such split, with all of it). Kafka ranges share no limit: reads are
        never grouped (``parts`` does not apply). The reads are independent (each
        accounted with ``account``); empty when there is nothing to do."""
        if self.phase is Phase.FORWARDING or not self.started or self.paused:
            return []
        total = max_rows if self.budget is None else min(max_rows, self.budget)
        pending = [
            s
            for s, p in self.progress.items()
            if p.state is SplitState.BACKFILLING and s not in self.exhausted
        ]
        if grouping is ReadGrouping.FIRST:
            pending = pending[:1]
        if total <= 0 or not pending:
            return []
        share, extra = divmod(total, len(pending))
        reads = []
        for i, s in enumerate(pending):
            limit = share + (1 if i < extra else 0)
            if limit <= 0:
                break  # fewer rows than splits: the last ones wait for the next call
            p = self.progress[s]
            start = None if p.offset is None else p.offset + 1
            reads.append(OffsetRead(s, self.open_epoch, start, p.target_offset, limit))
        return reads

    def account(self, read: OffsetRead, result: SplitSummary | SplitOffsets) -> int:
        """Account for ``read`` from its offsets (returns how many leading ones are
        visible, to write at ``open_epoch``) or from its summary (its visible rows were
        written elsewhere: returns 0)."""
        if isinstance(result, SplitOffsets):
            return self._on_backfill_rows(read, result.offsets, end=result.end)
        self._on_backfill_summary(
            read,
            result.count,
            result.last_offset,
            result.visible,
            last_visible=result.last_visible,
            end=result.end,
        )
        return 0

    def _on_backfill_rows(
        self, read: OffsetRead, offsets: Sequence[int], *, end: int | None = None
    ) -> int:
        """Account for the offsets ``read`` returned (ascending); returns how many leading
        ones are visible (written at ``open_epoch``). ``end``: the reader saw every
        message below it (``on_backfill_end``)."""
        self._check_read(read, len(offsets), offsets[-1] if offsets else None, end)
        prev: int | None = None
        for o in offsets:
            if (read.start is not None and o < read.start) or (prev is not None and o <= prev):
                raise ValueError("backfill offsets must ascend from the read's start")
            prev = o
        p, visible = self.progress[read.split], 0
        for o in offsets:
            p, vis = on_backfill_row(p, o)
            visible += vis
        self._account(read, on_backfill_end(p, end), len(offsets))
        return visible

    def _on_backfill_summary(
        self,
        read: OffsetRead,
        count: int,
        last_offset: int | None,
        visible: int,
        *,
        last_visible: int | None = None,
        end: int | None = None,
    ) -> None:
        """Account for a read whose rows were handled elsewhere (a Spark task wrote the
        ``visible`` leading ones of the ``count`` it read, the last at ``last_offset``).

        ``last_visible`` (the last visible offset) is needed only when rows after it
        were read too; the Spark path stops at the first row at or beyond the target.
        ``end`` as in ``_on_backfill_rows``.
        """
        self._check_read(read, count, last_offset, end)
        p = self.progress[read.split]
        if not 0 <= visible <= count:
            raise ValueError("visible must be between 0 and the rows read")
        if last_offset is None:
            self._account(read, on_backfill_end(p, end), 0)
            return
        lowest = (read.start or 0) + count - 1  # offsets ascend strictly from the start
        if last_offset < lowest:
            raise ValueError(f"{count} rows from {read.start} cannot end at {last_offset}")
        target = p.target_offset
        if visible == count and last_visible in (None, last_offset):
            caught_up = target is not None and last_offset >= target
            state = SplitState.SOURCE_CACHING_UP if caught_up else SplitState.BACKFILLING
            new = on_backfill_end(
                _moved(p, state, last_offset, p.num_consumed_rows + count, target),
                end,
            )
        else:
            # only the first row at or beyond the target hides the ones after it
            if target is None or visible == 0 or visible == count:
                raise ValueError(f"{visible} of {count} rows cannot be visible (target {target})")
            if last_visible is None or not target <= last_visible < last_offset:
                raise ValueError("hidden rows need the last visible offset, at or beyond target")
            if last_visible < (read.start or 0) + visible - 1 or (
                last_offset < last_visible + count - visible
            ):
                raise ValueError("the last visible offset does not fit the rows read")
            new = _moved(
                p, SplitState.SOURCE_CACHING_UP, last_visible, p.num_consumed_rows + count, target
            )
        self._account(read, new, count)

    def _check_read(
        self, read: OffsetRead, count: int, last_offset: int | None, end: int | None = None
    ) -> None:
        if self.phase is Phase.FORWARDING or not self.started:
            raise ValueError("no backfill reads outside the backfill stage")
        p = self.progress.get(read.split)
        if p is None:
            # dropped by a split change since (or never owned): its rows are not ours
            raise ReadProvenanceError(f"a read of split {read.split}, not owned by this actor")
        # the position is where the read starts and the target it stops after
        start = None if p.offset is None else p.offset + 1
        check_planned_now(
            f"split {read.split}",
            read.epoch,
            self.open_epoch,
            (read.start, read.target),
            (start, p.target_offset),
        )
        if p.state is not SplitState.BACKFILLING or read.split in self.exhausted:
            raise ValueError(f"split {read.split} has nothing to read in this epoch")
        if not 0 <= count <= read.limit:
            raise ValueError("a backfill read returned more rows than asked for")
        if (count > 0) != (last_offset is not None):
            raise ValueError("a read summary needs the last offset exactly when rows were read")
        if end is not None and (
            (read.start is not None and end < read.start)
            or (last_offset is not None and end <= last_offset)
        ):
            raise ValueError(f"a read of split {read.split} cannot end at {end}: before its rows")

    def _account(self, read: OffsetRead, p: SplitProgress, count: int) -> None:
        self.progress[read.split] = p
        self.epoch_rows += count
        if self.budget is not None:
            self.budget -= count
        if count < read.limit:
            self.exhausted.add(read.split)

    def on_skipped(self, split: str, count: int, last_offset: int) -> None:
        """``count`` messages of ``split`` read for the open epoch, the last at
        ``last_offset``, are not rows (its source's ``on_error: skip``): counted with the
        split's progress, which commits them."""
        p = self.progress.get(split)
        if p is None or count <= 0:
            return
        last = max(last_offset, p.last_skipped_offset or 0)
        self.progress[split] = replace(p, skipped=p.skipped + count, last_skipped_offset=last)

    # progress -------------------------------------------------------------

    def progress_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "split": s,
                "state": self.progress[s].state.value,
                "offset": self.progress[s].offset,
                "num_consumed_rows": self.progress[s].num_consumed_rows,
                "target_offset": self.progress[s].target_offset,
                "skipped": self.progress[s].skipped,
                "last_skipped_offset": self.progress[s].last_skipped_offset,
            }
            for s in split_order(self.progress)
        ]

    def report(self) -> dict[str, Any]:
        return {"splits": self.progress_rows(), "phase": self.phase.value}


def _check_upstream(
    upstream: Sequence[tuple[str, int]], owned: Mapping[str, Any], ends: Mapping[str, int]
) -> None:
    last: dict[str, int] = {}
    for s, offset in upstream:
        if s not in owned:
            raise ValueError(f"upstream row of split {s}, not owned by this actor")
        if s in last and offset <= last[s]:
            raise ValueError(f"upstream offsets of split {s} must ascend")
        last[s] = offset
    for s, end in ends.items():
        if s not in owned:
            raise ValueError(f"source end of split {s}, not owned by this actor")
        if s in last and end <= last[s]:
            raise ValueError(f"the source's end of split {s} is not past its rows")
