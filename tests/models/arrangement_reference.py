"""Row-at-a-time reference model of the arrangement backfill seed.

Written from ``arrangement_backfill.rs``: upstream rows of an epoch are buffered; the
snapshot is consumed one row at a time (vnodes in ascending order, each to its end),
moving ``current_pos``; at a barrier the buffered rows are emitted where their key is
at or below ``current_pos`` of their vnode (none for a vnode not started, all for a
completed one), or all of them when the snapshot stream ended during the epoch, which
finishes the backfill. A vnode restored as completed (a rescale dealt it to this actor)
is never read again: the view holds all its rows.
Rows here are ``(key, value)`` with the key first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.models.flow import follow

Row = tuple[Any, ...]


@dataclass
class Progress:
    state: str = "not_started"  # not_started | in_progress | completed
    pos: Row | None = None
    rows: int = 0


@dataclass
class ArrangementReference:
    vnodes: list[int]
    rate_limit: int | None = None
    paused: bool = False
    progress: dict[int, Progress] = field(default_factory=dict)
    finished: bool = False
    buffer: list[tuple[str, int, Row | None, Row | None]] = field(default_factory=list)
    ended: set[int] = field(default_factory=set)  # vnodes whose read ended this epoch
    budget: int | None = 0
    started: bool = False

    def __post_init__(self) -> None:
        for v in self.vnodes:
            self.progress.setdefault(v, Progress())
        self.finished = all(p.state == "completed" for p in self.progress.values())
        self.ended = self._completed()

    def _completed(self) -> set[int]:
        return {v for v, p in self.progress.items() if p.state == "completed"}

    # messages -------------------------------------------------------------

    def upstream(self, op: str, vnode: int, old: Row | None, new: Row | None) -> None:
        if vnode in self.progress:
            self.buffer.append((op, vnode, old, new))

    def read_one(self, snapshot: dict[int, list[Row]]) -> Row | None:
        """Consume the next snapshot row (or detect the end of a vnode); None: nothing read."""
        if self.finished or not self.started:
            return None
        for v in self.vnodes:
            if v in self.ended:
                continue
            if self.budget is not None and self.budget <= 0:
                return None
            p = self.progress[v]
            rest = [r for r in snapshot.get(v, []) if p.pos is None or (r[0],) > p.pos]
            if not rest:
                self.ended.add(v)
                continue
            row = rest[0]
            self.progress[v] = Progress("in_progress", (row[0],), p.rows + 1)
            if self.budget is not None:
                self.budget -= 1
            return row
        return None

    def read_one_from(self, vnode: int, snapshot: dict[int, list[Row]]) -> Row | None:
        """Consume the next snapshot row of one vnode (the seed merges per-vnode streams)."""
        if self.finished or not self.started or vnode in self.ended:
            return None
        if self.budget is not None and self.budget <= 0:
            return None
        p = self.progress[vnode]
        rest = [r for r in snapshot.get(vnode, []) if p.pos is None or (r[0],) > p.pos]
        if not rest:
            self.ended.add(vnode)
            return None
        row = rest[0]
        self.progress[vnode] = Progress("in_progress", (row[0],), p.rows + 1)
        if self.budget is not None:
            self.budget -= 1
        return row

    def barrier(
        self, elapsed_ms: int, mutation: dict[str, Any] | None, actor_id: int
    ) -> list[tuple[str, Row | None, Row | None]]:
        """Returns the emitted rows as (op, old, new), in arrival order."""
        out: list[tuple[str, Row | None, Row | None]] = []
        if self.started:
            snapshot_ended = not self.finished and self.ended >= set(self.vnodes)
            for op, vnode, old, new in self.buffer:
                key = (new or old)[0]  # type: ignore[index]
                p = self.progress[vnode]
                if (
                    self.finished
                    or snapshot_ended
                    or p.state == "completed"
                    or p.state != "not_started"
                    and p.pos is not None
                    and (key,) <= p.pos
                ):
                    out.append((op, old, new))
            if snapshot_ended:
                for v, p in self.progress.items():
                    self.progress[v] = Progress("completed", p.pos, p.rows)
                self.finished = True
        self.buffer = []
        self.started = True
        self.ended = self._completed()
        self.paused, self.rate_limit, self.budget = follow(
            mutation, actor_id, self.paused, self.rate_limit, elapsed_ms, self.budget
        )
        return out
