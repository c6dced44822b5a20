"""Row-at-a-time reference model of the snapshot backfill seed.

Written from ``snapshot_backfill_executor.rs``. Phase 1 consumes the snapshot at
``snapshot_epoch`` one row at a time (vnodes ascending, each to its end), per vnode
``{epoch, row_count, Consuming(pk) | Consumed}``; fake barriers pass until the one that
opens ``snapshot_epoch``. Meanwhile an upstream buffer collects the upstream's rows by
epoch and its barriers (the seed's ``UpstreamBuffer`` / ``PendingBarriers``; every
barrier is a checkpoint here, and an upstream epoch is sealed whole, so the seed's
``is_polling_epoch_data`` never holds). The barrier ``{snapshot_epoch, e1}`` starts the
log store: the lag cap starts at the pending lag. Every later barrier consumes the
oldest pending upstream epoch (it must be the barrier's ``prev``), emits its rows in
arrival order, lets the upstream deliver barriers while ``pending lag < cap``, then
shrinks the cap to ``min(pending lag, cap - elapsed / 2)``. No pending epoch left: the
log store is finished (finish reported) and every later barrier forwards the rows of
the epoch it closes. Lags are kept in raw epoch units, as in the seed.

Where the epoch-level executor names things the seed does not, the model follows it:
phases ``snapshot | log_store | finishing | done`` (``finishing`` = the barrier that
reports finish; when the log store is empty from the start the seed reports at the next
barrier, here at once), the lag in phase 1 is measured from ``snapshot_epoch``, and a
vnode's ``row_count`` stays its snapshot count (the seed stores the epoch's change-log
count there in phase 2). Rows here are ``(key, value)`` with the key first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.models.flow import follow

Row = tuple[Any, ...]
Change = tuple[str, Row | None, Row | None]  # (op, old, new)


@dataclass
class Progress:
    epoch: int
    rows: int = 0
    state: str = "consuming"  # consuming (pos: last pk read, None: not started) | consumed
    pos: Row | None = None


@dataclass
class SnapshotReference:
    vnodes: list[int]
    snapshot: dict[int, list[Row]]  # the upstream at snapshot_epoch, per vnode, pk order
    snapshot_epoch: int
    rate_limit: int | None = None
    paused: bool = False
    progress: dict[int, Progress] = field(default_factory=dict)
    phase: str = "snapshot"
    finished: bool = False
    budget: int | None = 0
    started: bool = False
    # the upstream buffer
    open_rows: list[Change] = field(default_factory=list)  # rows of the upstream's open epoch
    epoch_rows: dict[int, list[Change]] = field(default_factory=dict)  # sealed epoch -> rows
    pending: list[int] = field(default_factory=list)  # sealed, not consumed, oldest first
    latest: int = 0
    consumed: int = 0
    log_started: bool = False
    max_pending_epoch_lag: int | None = None  # None: u64::MAX
    # where the log store starts: the snapshot epoch, or the committed epoch a recovery in
    # phase 2 resumes from (every vnode consumed there; the upstream's later epochs pend)
    log_start: int = 0

    def __post_init__(self) -> None:
        for v in self.vnodes:
            self.progress.setdefault(v, Progress(self.snapshot_epoch))
        if not self.log_start:
            self.log_start = self.snapshot_epoch
        elif self.log_start >= self.snapshot_epoch:
            assert all(p.state == "consumed" for p in self.progress.values())
            self.phase = "log_store"
        self.latest = self.log_start

    # upstream -------------------------------------------------------------

    def upstream(self, op: str, vnode: int, old: Row | None, new: Row | None) -> None:
        if vnode in self.progress:
            self.open_rows.append((op, old, new))

    def upstream_barrier(self, epoch: int) -> None:
        """The upstream sealed ``epoch``: its rows are those received since the last one."""
        assert epoch > self.latest
        self.epoch_rows[epoch] = self.open_rows
        self.open_rows = []
        self.latest = epoch
        if not self.finished:
            self.pending.append(epoch)

    def pending_epoch_lag(self) -> int:
        if not self.log_started:
            return self.latest - self.log_start
        return self.pending[-1] - self.consumed if self.pending else 0

    def can_consume_upstream(self) -> bool:
        if not self.log_started or self.phase in ("finishing", "done"):
            return True
        cap = self.max_pending_epoch_lag
        return cap is None or self.pending_epoch_lag() < cap

    # snapshot -------------------------------------------------------------

    def _take(self, vnode: int) -> Row | None:
        p = self.progress[vnode]
        rest = [r for r in self.snapshot.get(vnode, []) if p.pos is None or (r[0],) > p.pos]
        if not rest:
            p.state = "consumed"
            return None
        row = rest[0]
        p.pos, p.rows = (row[0],), p.rows + 1
        if self.budget is not None:
            self.budget -= 1
        return row

    def _reading(self) -> bool:
        return (
            self.started
            and self.phase == "snapshot"
            and not (self.budget is not None and self.budget <= 0)
        )

    def read_one(self) -> Row | None:
        """Consume the next snapshot row (ending vnodes on the way); None: nothing read."""
        for v in self.vnodes:
            if not self._reading():
                return None
            if self.progress[v].state == "consumed":
                continue
            if (row := self._take(v)) is not None:
                return row
        return None

    def read_one_from(self, vnode: int) -> Row | None:
        if not self._reading() or self.progress[vnode].state == "consumed":
            return None
        return self._take(vnode)

    # barriers -------------------------------------------------------------

    def barrier(
        self,
        prev: int,
        curr: int,
        elapsed_ms: int,
        mutation: dict[str, Any] | None,
        actor_id: int,
        poll_upstream: Callable[[], bool] = lambda: False,
    ) -> list[Change]:
        """Returns the emitted rows in arrival order. ``poll_upstream`` delivers the next
        upstream barrier if one is ready (True) while the seed lets the upstream run."""
        out: list[Change] = []
        if self.phase == "snapshot":
            assert curr <= self.snapshot_epoch, "a fake barrier past the snapshot epoch"
            if curr == self.snapshot_epoch:
                assert all(p.state == "consumed" for p in self.progress.values())
                self.phase = "log_store"
        elif self.phase == "log_store" and not self.log_started:
            assert prev == self.log_start
            self.log_started = True
            self.consumed = self.log_start
            self.max_pending_epoch_lag = self.pending_epoch_lag()
            if not self.pending:
                self._finish()
        elif self.phase == "log_store":
            # the meta skips the upstream epochs that changed nothing (ours, not the seed's)
            assert prev in self.pending, "replaying out of order"
            skipped = self.pending[: self.pending.index(prev)]
            assert not any(self.epoch_rows[e] for e in skipped), "skipped an epoch with changes"
            del self.pending[: len(skipped) + 1]
            elapsed = prev - self.consumed
            self.consumed = prev
            out = list(self.epoch_rows[prev])
            if self.pending:
                while self.can_consume_upstream() and poll_upstream():
                    pass
            cap = self.max_pending_epoch_lag
            lag = self.pending_epoch_lag()
            self.max_pending_epoch_lag = (
                lag if cap is None else min(lag, max(0, cap - elapsed // 2))
            )
            self._at(prev)
            if not self.pending:
                self._finish()
        else:  # phase 3: the upstream's rows of the closed epoch
            out = list(self.epoch_rows[prev])
            self.consumed = prev
            self._at(prev)
            self.phase = "done"
        self.started = True
        self.paused, self.rate_limit, self.budget = follow(
            mutation, actor_id, self.paused, self.rate_limit, elapsed_ms, self.budget
        )
        return out

    def _at(self, epoch: int) -> None:
        for p in self.progress.values():
            p.epoch = epoch

    def _finish(self) -> None:
        self.phase = "finishing"
        self.finished = True
