"""The source backfill where mutants survived its property test (`make mutation`, issue
39): the refusals of reads, summaries and upstream rows that cannot be (the property test
feeds only consistent ones), how rows are shared among splits, an empty summary, the
backfill info of splits that are not backfilling, and the report.

Each test names the planted change it fails on (mutmut's rendering of it)."""

from __future__ import annotations

import pytest

from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import Phase
from backfill_core.executors.messages import Barrier
from backfill_core.executors.source import (
    OffsetRead,
    SourceBackfill,
    SplitProgress,
    SplitState,
    split_order,
    split_visible_prefix,
)
from tests.kit.executors import ACTOR, account_offsets, account_split_summary, epoch

CACHING_UP = SplitState.SOURCE_CACHING_UP


def _barrier(i: int) -> Barrier:
    """The barrier closing epoch(i) and opening epoch(i + 1): 100 ms apart."""
    return Barrier(EpochPair(epoch(i), epoch(i + 1)))


def _started(
    target: int | None = 9, splits: tuple[str, ...] = ("0",), rate_limit: int | None = None
) -> SourceBackfill:
    """Splits with offsets up to ``target`` (None: no backfill info), in their first epoch."""
    ex = SourceBackfill(ACTOR, splits, rate_limit=rate_limit)
    if target is not None:
        ex.on_backfill_info({s: target for s in splits})
    ex.on_barrier(_barrier(0), [])
    return ex


def _read(ex: SourceBackfill, max_rows: int = 10) -> OffsetRead:
    reads = ex.plan_reads(max_rows)
    assert len(reads) == 1
    return reads[0]


def _at_five(target: int = 5) -> tuple[SourceBackfill, OffsetRead]:
    """Offsets 0..4 backfilled (a full read), and the read planned next, from 5."""
    ex = _started(target)
    account_offsets(ex, _read(ex, 5), [0, 1, 2, 3, 4])
    read = _read(ex)
    assert (read.start, read.target) == (5, target)
    return ex, read


# the upstream and the order of splits ---------------------------------------------------


def test_upstream_offsets_of_a_split_must_ascend_strictly() -> None:
    """Kills ``offset < last[s]`` (an offset delivered twice in one epoch)."""
    ex = _started()
    with pytest.raises(ValueError):
        ex.on_barrier(_barrier(1), [("0", 5), ("0", 5)])


def test_splits_sort_numerically_when_all_are_numbers_else_as_text() -> None:
    """Kills ``sorted(ss, key=None)`` / ``sorted(ss, )`` and ``sorted(None)``."""
    assert split_order(["10", "9", "1"]) == ["1", "9", "10"]
    assert split_order(["b", "10", "a"]) == ["10", "a", "b"]


def test_the_visible_prefix_ends_at_the_first_offset_at_the_target() -> None:
    """Kills ``o > p.target_offset`` and ``return 1`` for a split no longer backfilling."""
    backfilling = SplitProgress(SplitState.BACKFILLING, 2, 3, 4)
    assert split_visible_prefix([3, 4, 5], backfilling) == 2
    assert split_visible_prefix([5, 6], SplitProgress(CACHING_UP, 4, 5, 4)) == 0


# reads ----------------------------------------------------------------------------------


def test_no_read_is_accounted_before_the_first_barrier() -> None:
    """Kills ``phase is FORWARDING and not self.started`` in ``_check_read``."""
    ex = SourceBackfill(ACTOR, ["0"])
    ex.on_backfill_info({"0": 9})
    with pytest.raises(ValueError):
        account_offsets(ex, OffsetRead("0", 0, None, 9, 10), [])


def test_a_split_read_to_its_end_is_not_read_again_in_the_epoch() -> None:
    """Kills ``exhausted.add(None)`` and ``not BACKFILLING and read.split in exhausted``."""
    ex = _started()
    account_offsets(ex, _read(ex), [0, 1])  # 2 of 10: the reader has no more for now
    assert ex.plan_reads(10) == []
    with pytest.raises(ValueError):
        account_offsets(ex, OffsetRead("0", epoch(1), 2, 9, 10), [2])


def test_a_read_that_found_nothing_may_end_where_it_started() -> None:
    """Kills ``end <= read.start`` (an empty read from 5 that saw every offset below 5)."""
    ex, read = _at_five(target=9)
    assert account_offsets(ex, read, [], end=5) == 0
    assert ex.progress["0"] == SplitProgress(SplitState.BACKFILLING, 4, 5, 9)


def test_backfill_offsets_must_ascend_strictly() -> None:
    """Kills ``... and (prev is not None and o <= prev)``, ``o < prev`` and ``prev = None``."""
    ex = _started()
    read = _read(ex)
    for offsets in ([0, 0], [1, 0]):
        with pytest.raises(ValueError):
            account_offsets(ex, read, offsets)
    assert ex.progress["0"] == SplitProgress(SplitState.BACKFILLING, None, 0, 9)


def test_a_budget_of_one_row_is_read() -> None:
    """Kills ``total <= 1`` (10 rows/s over 100 ms: one row)."""
    ex = _started(rate_limit=10)
    assert ex.plan_reads(10) == [OffsetRead("0", epoch(1), None, 9, 1)]


def test_the_rows_of_a_call_are_shared_among_splits_the_first_taking_the_rest() -> None:
    """Kills ``share - (...)``, ``(i < extra) and False``, ``2 if i < extra``,
    ``limit <= 1`` and ``return`` for ``break``."""
    ex = _started(splits=("0", "1", "2"))
    assert [(r.split, r.limit) for r in ex.plan_reads(5)] == [("0", 2), ("1", 2), ("2", 1)]
    assert [(r.split, r.limit) for r in ex.plan_reads(2)] == [("0", 1), ("1", 1)]


def test_an_idle_epochs_budget_carries_over() -> None:
    """Kills ``epoch_budget(..., None)`` / a dropped ``self.budget`` in ``on_barrier``."""
    ex = _started(rate_limit=10)
    ex.on_barrier(_barrier(1), [])
    assert _read(ex, 100).limit == 2


# backfill info --------------------------------------------------------------------------


def test_backfill_info_for_a_split_not_owned_is_refused() -> None:
    """Kills ``unknown = None`` (a KeyError later instead of the refusal)."""
    ex = SourceBackfill(ACTOR, ["0"])
    with pytest.raises(ValueError):
        ex.on_backfill_info({"1": 3})


def test_an_emptied_partition_finishes_a_resumed_split() -> None:
    """Kills ``replace(p, state=FINISHED, )`` (a finished split keeping its offset)."""
    ex = SourceBackfill(ACTOR, ["0"], restore={"0": SplitProgress(SplitState.BACKFILLING, 4, 5, 9)})
    ex.on_backfill_info({"0": None})
    assert ex.progress["0"] == SplitProgress(SplitState.FINISHED, None, 5, 9)


def test_backfill_info_skips_a_finished_split_and_goes_on() -> None:
    """Kills ``break`` for ``continue``."""
    ex = SourceBackfill(ACTOR, ["0", "1"], restore={"0": SplitProgress(SplitState.FINISHED)})
    ex.on_backfill_info({"0": 3, "1": 7})
    assert ex.progress["1"].target_offset == 7


# summaries (a Spark task wrote the rows) ------------------------------------------------


def test_an_empty_summary_ends_the_split_at_its_target_when_nothing_is_left() -> None:
    """Kills every change to ``_account(read, on_backfill_end(p, end), 0)`` and
    ``1 <= visible`` / ``0 < visible`` (an empty read refused)."""
    ex = _started(target=4)
    account_split_summary(ex, _read(ex), 0, None, 0, end=5)  # offsets 0..4: markers only
    assert ex.progress["0"] == SplitProgress(CACHING_UP, 4, 0, 4)
    assert ex.epoch_rows == 0
    assert ex.plan_reads(10) == []


def test_a_summary_with_rows_ends_the_split_where_the_reader_saw_everything() -> None:
    """Kills ``on_backfill_end(SplitProgress(...), None)`` and the end dropped from
    ``_check_read`` (an end before the last row accepted)."""
    ex = _started()
    read = _read(ex)
    with pytest.raises(ValueError):
        account_split_summary(ex, read, 3, 2, 3, end=2)
    account_split_summary(ex, read, 3, 2, 3, end=20)  # 3..9 hold no message
    assert ex.progress["0"] == SplitProgress(CACHING_UP, 9, 3, 9)


def test_a_summary_count_must_fit_between_its_start_and_last_offset() -> None:
    """Kills ``(read.start or 0) - count - 1`` and ``+ count - 2``."""
    ex, read = _at_five(target=9)
    with pytest.raises(ValueError):
        account_split_summary(ex, read, 3, 6, 3)  # 3 offsets from 5 end at 7 at least


def test_rows_hidden_after_the_target_are_accounted_up_to_the_last_visible() -> None:
    """Kills ``visible == 1`` for ``== 0``, ``target < last_visible``, ``last_visible <=
    start + visible - 1``, ``+ visible + 1`` and ``last_offset <= ...``."""
    ex, read = _at_five()
    account_split_summary(ex, read, 3, 7, 1, last_visible=5)  # 5 visible, 6 and 7 hidden
    assert ex.progress["0"] == SplitProgress(CACHING_UP, 5, 8, 5)


def test_hidden_rows_from_the_earliest_offset_fit_from_offset_zero() -> None:
    """Kills ``(read.start or 1)``."""
    ex = _started(target=2)
    account_split_summary(ex, _read(ex), 4, 3, 3, last_visible=2)  # 0, 1, 2 visible, 3 hidden
    assert ex.progress["0"] == SplitProgress(CACHING_UP, 2, 4, 2)


@pytest.mark.parametrize(
    ("count", "last_offset", "visible", "last_visible"),
    [
        (3, 7, 1, None),  # hidden rows without the last visible offset
        (2, 7, 0, 5),  # nothing visible, yet rows hidden
        (3, 7, 2, 5),  # two visible rows cannot end at 5 when read from 5
        (3, 7, 1, 6),  # two hidden rows cannot follow 6 and end at 7
    ],
)
def test_a_summary_of_hidden_rows_that_cannot_be_is_refused(
    count: int, last_offset: int, visible: int, last_visible: int | None
) -> None:
    """Kills ``visible == count or last_visible in ...``, ``last_visible is None and ...``,
    ``visible == 0 and visible == count``, ``or`` to ``and`` between the fit checks, and
    each weakened bound (``- visible - 1``, ``(read.start and 0)``, ``visible - 2``,
    ``last_visible - count - visible``)."""
    ex, read = _at_five()
    with pytest.raises(ValueError):
        account_split_summary(ex, read, count, last_offset, visible, last_visible=last_visible)
    assert ex.progress["0"] == SplitProgress(SplitState.BACKFILLING, 4, 5, 5)


def test_hidden_rows_need_a_target() -> None:
    """Kills ``target is None and visible == 0 or ...`` (a TypeError instead)."""
    ex = _started(target=None)
    with pytest.raises(ValueError):
        account_split_summary(ex, _read(ex), 3, 2, 1, last_visible=0)


# barriers and reports -------------------------------------------------------------------


def test_the_backfill_stage_waits_for_the_other_actors_unless_told() -> None:
    """Kills ``others_finished: bool = True``."""
    ex = SourceBackfill(ACTOR, ["0"])
    ex.on_backfill_info({"0": None})  # empty: finished from the start
    ex.on_barrier(_barrier(0), [])
    ex.on_barrier(_barrier(1), [])
    assert ex.phase is Phase.BACKFILLING
    ex.on_barrier(_barrier(2), [], others_finished=True)
    assert ex.phase is Phase.FORWARDING


def test_a_source_job_reports_its_phase() -> None:
    """Kills ``"PHASE"`` / ``"XXphaseXX"`` in ``report``."""
    ex = SourceBackfill(ACTOR, ["0"])
    assert ex.report() == {"splits": ex.progress_rows(), "phase": "backfilling"}


def test_committed_split_progress_without_a_row_count_has_read_none() -> None:
    """Kills ``row.get("num_consumed_rows", None)`` / ``1`` / no default (older progress
    rows have no count)."""
    p = SplitProgress.from_row({"state": "backfilling", "offset": 4})
    assert p == SplitProgress(SplitState.BACKFILLING, 4, 0, None)
