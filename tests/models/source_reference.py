"""Row-at-a-time reference model of the source backfill seed.

Written from ``source_backfill_executor.rs``: a ``BackfillStage`` of split -> (state,
offset, consumed rows, target offset) fed one message at a time, in the order the
seed's merged stream would deliver them: barriers, upstream rows (``handle_upstream_row``)
and rows the backfill reader got from Kafka (``handle_backfill_row``). At a barrier the
states are persisted and progress (or finish) is reported, then the split change is
applied; an actor that reported finish leaves the backfill stage once every split of
the job is ``Finished``. The forward stage only forwards and follows split changes.

``table`` is the actor's part of the seed's state table: every barrier of the backfill
stage sets the splits' states (``set_states``), and a split change trims the splits it
drops (``trim_state``: a split change here is the seed's ``SourceChangeSplit``); a split
new to the job in the forward stage is set ``Finished``. The seed means to trim in both
stages, but its backfill stage extracts the dropped splits from a map it has already
emptied (``mem::take``), so it trims nothing there and a dropped unfinished split would
keep ``backfill_finished`` false for good; the model trims as the seed means to.

Messages: ``("barrier", ModelBarrier)``, ``("upstream", split, offset)``,
``("backfill", split, offset)``, and two the seed lacks: ``("backfill_end", split,
end)``, the backfill reader saw every message of the split below ``end``: past the
target with no row there (its tail are transaction markers), the split caches up from
the target instead of waiting for a newer message; and ``("source_end", split, end)``
after a barrier's upstream rows, the shared source has delivered every message of the
split below ``end``: a split caching up from an offset below ``end`` is finished (no
newer message needed). ``emitted[k]`` holds the (split, offset) rows made visible after
the k-th barrier; ``reports[k]`` what the k-th barrier reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.models.flow import follow

BACKFILLING, CACHING_UP, FINISHED = "backfilling", "source_caching_up", "finished"


@dataclass
class SplitRef:
    state: str = BACKFILLING
    offset: int | None = None  # Backfilling(offset) / SourceCachingUp(offset)
    consumed: int = 0
    target: int | None = None

    def as_tuple(self) -> tuple[str, int | None, int, int | None]:
        return (self.state, self.offset, self.consumed, self.target)


@dataclass
class ModelBarrier:
    elapsed_ms: int
    mutation: dict[str, Any] | None = None  # JSON: pause / resume / throttle / splits
    others_finished: bool = False  # the state table scan of the other actors' splits
    committed: dict[str, SplitRef] = field(default_factory=dict)  # for migrated splits


@dataclass
class Report:
    progress: dict[str, tuple[str, int | None, int, int | None]]
    total: int  # the seed's total_backfilled_rows: consumed rows of the splits reported
    finished: bool
    rows: int  # backfill rows consumed in the closed epoch
    forwarding: bool  # the stage after the barrier


@dataclass
class SourceReference:
    actor_id: int
    states: dict[str, SplitRef]
    rate_limit: int | None = None
    paused: bool = False
    forwarding: bool = False
    started: bool = False
    budget: int | None = 0
    epoch_rows: int = 0
    reports: list[Report] = field(default_factory=list)
    emitted: list[list[tuple[str, int]]] = field(default_factory=list)
    table: dict[str, tuple[str, int | None, int, int | None]] = field(default_factory=dict)
    trimmed: set[str] = field(default_factory=set)  # splits split changes dropped for good

    def total_backfilled_rows(self) -> int:
        return sum(s.consumed for s in self.states.values())

    def backfill_info(self, latest: dict[str, int | None]) -> None:
        """After building the reader: no data -> Finished, else the target is the latest."""
        for split, offset in latest.items():
            s = self.states[split]
            if s.state != BACKFILLING:
                continue
            if offset is None:
                self.states[split] = SplitRef(FINISHED, None, s.consumed, s.target)
            else:
                s.target = offset

    def feed(self, messages: list[tuple[Any, ...]]) -> None:
        for m in messages:
            if m[0] == "barrier":
                self.barrier(m[1])
            elif m[0] == "upstream":
                self.upstream(m[1], m[2])
            elif m[0] == "backfill":
                self.backfill(m[1], m[2])
            elif m[0] == "backfill_end":
                self.backfill_end(m[1], m[2])
            elif m[0] == "source_end":
                self.source_end(m[1], m[2])
            else:
                raise ValueError(m)

    # messages -------------------------------------------------------------

    def barrier(self, b: ModelBarrier) -> Report:
        progress = {k: s.as_tuple() for k, s in self.states.items()}
        total = self.total_backfilled_rows()
        if self.forwarding:
            report = Report(progress, total, True, 0, True)
        elif not self.started:
            # the first barrier passes before the stage is built: nothing to report
            report = Report(progress, total, False, 0, False)
        else:
            self.table.update(progress)  # set_states, committed with the barrier
            done = all(s.state in (FINISHED, CACHING_UP) for s in self.states.values())
            report = Report(progress, total, done, self.epoch_rows, False)
        mutation = b.mutation or {}
        assignment = (mutation.get("splits") or {}).get(str(self.actor_id))
        if assignment is not None:
            self.apply_split_change(list(assignment), b.committed)
        if (
            not self.forwarding
            and report.finished
            and b.others_finished
            and all(s.state == FINISHED for s in self.states.values())
        ):
            self.forwarding = True
        report.forwarding = self.forwarding
        self.paused, self.rate_limit, self.budget = follow(
            b.mutation, self.actor_id, self.paused, self.rate_limit, b.elapsed_ms, self.budget
        )
        self.started = True
        self.epoch_rows = 0
        self.reports.append(report)
        self.emitted.append([])
        return report

    def apply_split_change(self, target: list[str], committed: dict[str, SplitRef]) -> None:
        new: dict[str, SplitRef] = {}
        for split in target:
            if split in self.states:
                new[split] = self.states[split]
            elif split in committed:
                c = committed[split]
                if self.forwarding and c.state != FINISHED:
                    raise ValueError(f"unexpected backfill state of {split}: {c}")
                new[split] = SplitRef(c.state, c.offset, c.consumed, c.target)
            else:
                new[split] = SplitRef(FINISHED)  # a partition new to the job: no backfill
                if self.forwarding:
                    self.table[split] = new[split].as_tuple()
        dropped = set(self.states) - set(new)
        for split in dropped:
            self.table.pop(split, None)  # trim_state
        self.trimmed = (self.trimmed | dropped) - set(new)
        self.states = new

    def upstream(self, split: str, offset: int) -> bool:
        if split not in self.states:
            raise ValueError(f"split {split} not owned")
        s = self.states[split]
        visible = False
        if self.forwarding:
            visible = True
        elif s.state == BACKFILLING:
            if s.offset is None or s.offset < offset:
                pass
            elif s.offset == offset:
                s.state, s.offset = FINISHED, None
            else:
                s.state = CACHING_UP
        elif s.state == CACHING_UP:
            assert s.offset is not None
            if s.offset < offset:
                s.state, s.offset, visible = FINISHED, None, True
            elif s.offset == offset:
                s.state, s.offset = FINISHED, None
        else:
            visible = True
        if s.state == BACKFILLING:
            s.target = offset
        if visible:
            self.emitted[-1].append((split, offset))
        return visible

    def backfill(self, split: str, offset: int) -> bool:
        assert self.started and not self.forwarding, "backfill rows only in the backfill stage"
        assert self.budget is None or self.budget > 0, "backfill row beyond the rate limit"
        if self.budget is not None:
            self.budget -= 1
        self.epoch_rows += 1
        s = self.states[split]
        s.consumed += 1
        if s.state != BACKFILLING:
            return False
        if s.target is not None and offset >= s.target:
            s.state = CACHING_UP
        s.offset = offset
        self.emitted[-1].append((split, offset))
        return True

    def backfill_end(self, split: str, end: int) -> None:
        assert self.started and not self.forwarding, "backfill reads only in the backfill stage"
        s = self.states[split]
        if s.state == BACKFILLING and s.target is not None and end > s.target:
            s.state, s.offset = CACHING_UP, s.target

    def source_end(self, split: str, end: int) -> None:
        s = self.states[split]
        if s.state == CACHING_UP and s.offset is not None and end > s.offset:
            s.state, s.offset = FINISHED, None
