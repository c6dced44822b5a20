"""Row-at-a-time reference model of the rearranged chain seed.

Written from ``rearranged_chain_excerpt.rs``: the snapshot is the upstream at the first
barrier's ``prev`` and is consumed one row at a time (vnodes in ascending order, each to
its end), moving ``current_pos``. Every barrier passes at once; the upstream rows that
arrived before it are kept as one buffered epoch (the phantom barrier left in place of
the rearranged one). After the snapshot ended, buffered epochs are emitted in order, at
most ``per_barrier`` of them at a barrier; the barrier at which none is left behind is
where the phantom caught up with the last rearranged barrier: finish, then forward.
Rows here are ``(key, value)`` with the key first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.models.flow import follow

Row = tuple[Any, ...]
Change = tuple[str, Row | None, Row | None]  # (op, old, new)


@dataclass
class Progress:
    state: str = "not_started"  # not_started | in_progress | completed (read to its end)
    pos: Row | None = None
    rows: int = 0


@dataclass
class ChainReference:
    vnodes: list[int]
    rate_limit: int | None = None
    paused: bool = False
    per_barrier: int = 8
    progress: dict[int, Progress] = field(default_factory=dict)
    finished: bool = False
    current: list[Change] = field(default_factory=list)  # upstream rows of the open epoch
    buffered: list[list[Change]] = field(default_factory=list)  # closed epochs not emitted
    budget: int | None = 0
    started: bool = False

    def __post_init__(self) -> None:
        for v in self.vnodes:
            self.progress.setdefault(v, Progress())

    @property
    def snapshot_ended(self) -> bool:
        return all(p.state == "completed" for p in self.progress.values())

    @property
    def phase(self) -> str:
        if self.finished:
            return "forwarding"
        return "replay" if self.started and self.snapshot_ended else "snapshot"

    # messages -------------------------------------------------------------

    def upstream(self, op: str, vnode: int, old: Row | None, new: Row | None) -> None:
        if vnode in self.progress:
            self.current.append((op, old, new))

    def _take(self, vnode: int, snapshot: dict[int, list[Row]]) -> Row | None:
        """The next row of ``vnode`` after its position; marks the vnode ended when none."""
        p = self.progress[vnode]
        rest = [r for r in snapshot.get(vnode, []) if p.pos is None or (r[0],) > p.pos]
        if not rest:
            self.progress[vnode] = Progress("completed", p.pos, p.rows)
            return None
        row = rest[0]
        self.progress[vnode] = Progress("in_progress", (row[0],), p.rows + 1)
        if self.budget is not None:
            self.budget -= 1
        return row

    def _reading(self) -> bool:
        return (
            self.started
            and not self.finished
            and not (self.budget is not None and self.budget <= 0)
        )

    def read_one(self, snapshot: dict[int, list[Row]]) -> Row | None:
        """Consume the next snapshot row (ending vnodes on the way); None: nothing read."""
        for v in self.vnodes:
            if not self._reading():
                return None
            if self.progress[v].state == "completed":
                continue
            if (row := self._take(v, snapshot)) is not None:
                return row
        return None

    def read_one_from(self, vnode: int, snapshot: dict[int, list[Row]]) -> Row | None:
        """Consume the next snapshot row of one vnode (the reads of vnodes are independent)."""
        if not self._reading() or self.progress[vnode].state == "completed":
            return None
        return self._take(vnode, snapshot)

    def barrier(
        self, elapsed_ms: int, mutation: dict[str, Any] | None, actor_id: int
    ) -> list[Change]:
        """Returns the emitted rows, in arrival order."""
        out: list[Change] = []
        if self.started:
            self.buffered.append(self.current)
            if self.finished or self.snapshot_ended:
                n = min(self.per_barrier, len(self.buffered))
                for epoch_rows in self.buffered[:n]:
                    out += epoch_rows
                del self.buffered[:n]
                self.finished = not self.buffered
        self.current = []
        self.started = True
        self.paused, self.rate_limit, self.budget = follow(
            mutation, actor_id, self.paused, self.rate_limit, elapsed_ms, self.budget
        )
        return out
