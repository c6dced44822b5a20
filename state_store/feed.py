"""A relation's change feed (``docs/reading.md#the-change-feed``): the net changes of
each epoch with changes after a given one, in epoch order, read from the versions the
store keeps (the change log of ``(previous epoch, epoch]``)."""

from __future__ import annotations

from typing import Any

from backfill_core.changes import RowChange
from state_store.versioned import VersionedTable


def changes_by_epoch(
    cur: Any, table: VersionedTable, after: int, upto: int, max_epochs: int
) -> list[tuple[int, list[RowChange]]]:
    """Up to ``max_epochs`` epochs in ``(after, upto]`` that changed ``table``, each with
    its net changes in (vnode, key) order. Only versions at or below ``upto`` are read,
    so nothing above a committed ``upto`` (which a recovery may roll back) shows."""
    out: list[tuple[int, list[RowChange]]] = []
    prev = after
    while len(out) < max_epochs and prev < upto:
        epoch = table.next_epoch_with_changes(cur, prev, upto)
        if epoch is None:
            break
        # no version lies in (prev, epoch): the range's net change is the epoch's own
        out.append((epoch, table.change_log_range(cur, prev, epoch, (0, table.schema.vnode_count))))
        prev = epoch
    return out
