"""The change logs of consecutive epoch ranges from one read of every version in them
(``VersionedTable.change_logs``): a snapshot backfill's replay steps through upstream
epochs one barrier each, and reading each epoch's log on its own cost every actor a
statement per epoch (docs/architecture.md, "Phase 2")."""

from __future__ import annotations

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
    i = 0
    while i < len(versions):
        first = versions[i]
        live = first.base  # the key's live row as of the versions seen so far
        j = 0  # the range of the version at hand
        while (
            i < len(versions) and versions[i].vnode == first.vnode and versions[i].key == first.key
        ):
            start = live  # the key's live row when range ``j`` begins
            while versions[i].epoch > bounds[j + 1]:
                j += 1
            last = versions[i]
            while (
                i + 1 < len(versions)
                and versions[i + 1].vnode == first.vnode
                and versions[i + 1].key == first.key
                and versions[i + 1].epoch <= bounds[j + 1]
            ):
                i += 1
                last = versions[i]
            change = _net(first.vnode, start, last)
            if change is not None:
                out[j].append(change)
            live = None if last.deleted else last.row
            i += 1
    return out


def _net(vnode: int, old: Row | None, new: KeyVersion) -> RowChange | None:
    if new.deleted:
        return None if old is None else RowChange(Op.DELETE, vnode, old, None)
    if old is None:
        return RowChange(Op.INSERT, vnode, None, new.row)
    return RowChange(Op.UPDATE, vnode, old, new.row)
