"""A relation's change feed (``GET /v1/tables/{name}/changes``, docs/reading.md): pieces of
committed epochs after a client's last marker, each epoch's net changes then its marker.

Each piece is read in one snapshot with the check against garbage collection, as
``read_rows`` does: a client whose last marker was collected gets the 410 of a read at
that epoch, naming the oldest epoch it can resume from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backfill_core.changes import Op
from service.catalog.queries import committed_epoch, get_relation, storage_of
from service.db import Database, raw_cursor
from service.usecases.tables import readable_epoch
from state_store.feed import changes_by_epoch

# epochs per piece: a client far behind gets its backlog in pieces of bounded memory
EPOCHS_PER_PIECE = 64


@dataclass(frozen=True)
class EpochChanges:
    """One epoch's net changes (``{"op", "row"}``, an update also ``"old"``) and its
    marker; an epoch without changes marks how far a client has read."""

    epoch: int
    changes: list[dict[str, Any]]


@dataclass(frozen=True)
class FeedPiece:
    epochs: list[EpochChanges]
    committed: int  # the relation's committed epoch when the piece was read


def read_feed(db: Database, name: str, after: int | None) -> FeedPiece:
    """The epochs that changed ``name`` after ``after`` (default: its committed epoch),
    up to ``EPOCHS_PER_PIECE``: 404 for an unknown relation, 409 for an epoch not
    committed yet, 410 for one garbage collection passed."""
    with db.snapshot() as s:
        rel = get_relation(s, name)
        committed = committed_epoch(s, rel.graph_id)
        start = readable_epoch(after, committed, rel.gc_epoch)
        table = storage_of(rel)
        schema = table.schema
        names = schema.names

        def as_json(row: Any) -> dict[str, Any]:
            return schema.row_to_json(dict(zip(names, row, strict=True)))

        epochs = []
        for epoch, changes in changes_by_epoch(
            raw_cursor(s), table, start, committed, EPOCHS_PER_PIECE
        ):
            out: list[dict[str, Any]] = []
            for c in changes:
                if c.op is Op.UPDATE:
                    out.append({"op": "update", "row": as_json(c.new), "old": as_json(c.old)})
                else:  # an insert's row is the new one, a delete's the old one
                    out.append({"op": c.op.value, "row": as_json(c.new or c.old)})
            epochs.append(EpochChanges(epoch, out))
        return FeedPiece(epochs, committed)
