"""Row-at-a-time reference model of the CDC backfill: what our table must be, not how
the executor gets there.

The upstream's history is replayed one change at a time to give the upstream table at
any LSN. The backfill's position moves to a chunk's last key (or to the end) when the
stream passes the chunk's high watermark; the expected table after the stream passed
``L`` is the upstream at ``L`` restricted to the keys at or below that position (all of
them once finished). Nothing here knows the merge rule (the executor's watermarks and
held chunk): only where the chunks end and when they count.
Rows are ``(key, value)`` with the key first; keys are ``(key,)`` tuples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.models.flow import follow

Row = tuple[Any, ...]
# (lsn, op, key, new row or None for a delete); op "wal": only the WAL moved
Change = tuple[int, str, int, Row | None]


@dataclass(frozen=True)
class Checkpoint:
    pos: Row | None
    finished: bool
    lsn: int
    chunks: int
    rows: int


@dataclass
class CdcReference:
    history: list[Change]
    lsn: int  # the stream's position: every change at or below it is delivered
    pos: Row | None = None
    finished: bool = False
    chunks: int = 0
    rows: int = 0
    # (high watermark, last key read, table ended, rows read) of the chunk waiting
    held: tuple[int, Row | None, bool, int] | None = None
    reading: bool = False
    started: bool = False
    paused: bool = False
    rate_limit: int | None = None
    budget: int | None = 0
    _cache: dict[int, dict[int, Row]] = field(default_factory=dict)

    # the upstream -----------------------------------------------------------

    def upstream_at(self, lsn: int) -> dict[int, Row]:
        """The upstream table after every change at or below ``lsn``, one at a time."""
        if lsn not in self._cache:
            table: dict[int, Row] = {}
            for at, op, key, row in self.history:
                if at > lsn:
                    break
                if op == "wal":  # another table's commit: the WAL moved, nothing else
                    continue
                if op == "delete":
                    assert key in table, f"delete of absent key {key} at {at}"
                    del table[key]
                else:
                    assert (key in table) == (op == "update"), f"{op} of key {key} at {at}"
                    assert row is not None
                    table[key] = row
            self._cache[lsn] = table
        return dict(self._cache[lsn])

    def select(self, after: Row | None, limit: int, at: int) -> list[Row]:
        """``SELECT ... WHERE pk > after ORDER BY pk LIMIT limit`` on the upstream at ``at``."""
        table = self.upstream_at(at)
        keys = sorted(k for k in table if after is None or (k,) > after)
        return [table[k] for k in keys[:limit]]

    # the backfill -----------------------------------------------------------

    def plan(self, max_rows: int) -> tuple[Row | None, int] | None:
        """``(after, limit)`` of the next chunk, or None when nothing may be read now."""
        if not self.started or self.finished or self.reading or self.held is not None:
            return None
        limit = max_rows if self.budget is None else min(max_rows, self.budget)
        if limit <= 0:
            return None
        self.reading = True
        return self.pos, limit

    def chunk(self, rows: list[Row], ended: bool, high: int) -> None:
        self.reading = False
        self.held = (high, (rows[-1][0],) if rows else None, ended, len(rows))
        if self.budget is not None:
            self.budget -= len(rows)
        self.stream_to(self.lsn)

    def stream_to(self, lsn: int) -> None:
        """The stream passed ``lsn``: a chunk held up to there counts now."""
        assert lsn >= self.lsn
        self.lsn = lsn
        if self.held is not None and lsn >= self.held[0]:
            _, last, ended, count = self.held
            self.pos = last if last is not None else self.pos
            self.finished = self.finished or ended
            self.chunks += 1
            self.rows += count
            self.held = None

    def expected(self) -> dict[int, Row]:
        """Our table as it must be now."""
        return {
            k: r
            for k, r in self.upstream_at(self.lsn).items()
            if self.finished or (self.pos is not None and (k,) <= self.pos)
        }

    # barriers and restores --------------------------------------------------

    def barrier(self, elapsed_ms: int, mutation: dict[str, Any] | None, actor_id: int) -> None:
        self.started = True
        self.paused, self.rate_limit, self.budget = follow(
            mutation, actor_id, self.paused, self.rate_limit, elapsed_ms, self.budget
        )

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.pos, self.finished, self.lsn, self.chunks, self.rows)

    def restore(self, cp: Checkpoint) -> None:
        """Back to a checkpoint: a chunk read or held since is gone (it is read again)."""
        self.pos, self.finished, self.lsn = cp.pos, cp.finished, cp.lsn
        self.chunks, self.rows = cp.chunks, cp.rows
        self.held, self.reading, self.started, self.budget = None, False, False, 0
