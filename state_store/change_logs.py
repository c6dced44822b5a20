"""The change logs of consecutive epoch ranges from one read of every version in them
(``VersionedTable.change_logs``): a snapshot backfill's replay steps through upstream
epochs one barrier each, and reading each epoch's log on its own cost every actor a
statement per epoch (docs/architecture.md, "Phase 2")."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from backfill_core.changes import Op, Row, RowChange


@dataclass(frozen=True, slots=True)
class KeyVersion:
    """One version in the ranges read, in (vnode, key, epoch) order; ``base``: the key's
    live row at or below the first bound (None: absent or deleted there)."""

    vnode: int
    key: Row
    epoch: int
    deleted: bool
    row: Row
    base: Row | None


def split_by_range(versions: Sequence[KeyVersion], bounds: Sequence[int]) -> list[list[RowChange]]:
    """The net change per key over each range ``(bounds[i], bounds[i + 1]]``, each in
    (vnode, key) order: what ``change_log_range`` gives for that range alone."""
    out: list[list[RowChange]] = [[] for _ in bounds[1:]]
    for _, of_key in itertools.groupby(versions, key=lambda v: (v.vnode, v.key)):
        of_key_list = list(of_key)
        live = of_key_list[0].base  # the key's live row as each range begins
        # (the range of epoch e is the i with bounds[i] < e <= bounds[i + 1])
        for i, in_range in itertools.groupby(
            of_key_list, key=lambda v: bisect.bisect_left(bounds, v.epoch) - 1
        ):
            last = list(in_range)[-1]
            change = _net(last.vnode, live, last)
            if change is not None:
                out[i].append(change)
            live = None if last.deleted else last.row
    return out


def _net(vnode: int, old: Row | None, new: KeyVersion) -> RowChange | None:
    if new.deleted:
        return None if old is None else RowChange(Op.DELETE, vnode, old, None)
    if old is None:
        return RowChange(Op.INSERT, vnode, None, new.row)
    return RowChange(Op.UPDATE, vnode, old, new.row)
