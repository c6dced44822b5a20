"""What the routes of exports and imports share (``service.api.exports``,
``service.api.imports``): the states a client sees and the members every view of one
has, from its row."""

from __future__ import annotations

from typing import Any, Literal

from service.catalog.models import Export, Import

TaskStateJson = Literal["queued", "running", "succeeded", "failed", "cancelled"]


def view_fields(x: Export | Import) -> dict[str, Any]:
    """The members of an export's or an import's view that both have."""
    return {
        "id": x.id,
        "table": x.relation,
        "format": x.format,
        "path": x.path,
        "state": x.state,
        "epoch": x.epoch,
        "rows": x.rows,
        "error": x.error,
        "worker_id": x.worker_id,
        "created_at": x.created_at,
        "started_at": x.started_at,
        "finished_at": x.finished_at,
    }
