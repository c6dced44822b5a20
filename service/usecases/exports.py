"""Exports: a relation's snapshot at a committed epoch written as files by a worker's
Spark job (``docs/reading.md#exports``). Creating one checks everything a worker
cannot fix (the path's form, the epoch) and pins the epoch in the same transaction, so
a bad request writes nothing and garbage collection cannot pass a queued export."""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import select

from backfill_core.protocol import ExportState
from service.catalog.models import EpochPin, Export
from service.catalog.queries import committed_epoch, get_relation
from service.db import Database
from service.errors import BadRequest, Conflict, NotFound
from service.meta.exports import pin_holder, release_pin
from service.usecases.tables import readable_epoch

FORMATS = ("parquet",)
# where Spark writes with its bundled file systems (file:) or the cluster's connectors
SCHEMES = ("file", "s3a", "hdfs")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(.*)", re.DOTALL)
_AUTHORITY = re.compile(r"//[^/]+(/.*)?", re.DOTALL)


def check_path(path: str) -> None:
    """An absolute path, as Spark takes it: ``file:/...`` (or ``file:///...``),
    ``s3a://bucket/...``, ``hdfs://namenode/...``, or ``/...`` on Spark's default file
    system. 400 otherwise, naming what is wrong."""

    def bad(why: str) -> BadRequest:
        return BadRequest(f"path {path!r}: {why}", {"field": "path"})

    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise bad("control characters are not allowed")
    m = _SCHEME.fullmatch(path)
    rest = path
    if m is not None:
        scheme, rest = m.group(1).lower(), m.group(2)
        if scheme not in SCHEMES:
            raise bad(f"unsupported scheme {scheme!r} (supported: {', '.join(SCHEMES)})")
        if scheme != "file":
            a = _AUTHORITY.fullmatch(rest)
            if a is None:
                raise bad(f"{scheme}: paths name their bucket or host ({scheme}://host/dir)")
            rest = a.group(1) or "/"
        elif rest.startswith("//"):
            a = _AUTHORITY.fullmatch(rest) if not rest.startswith("///") else None
            rest = rest[2:] if a is None else (a.group(1) or "")
    if not rest.startswith("/"):
        raise bad("not absolute")
    if ".." in rest.split("/") or "." in rest.split("/"):
        raise bad("'.' and '..' segments are not allowed")
    if rest.rstrip("/") == "":
        raise bad("not the root of a file system")


def create_export(db: Database, name: str, fmt: str, path: str, epoch: int | None) -> Export:
    """Queue the export of ``name`` at ``epoch`` (default: its latest committed one):
    409 if not committed yet, 410 if garbage-collected, as reads at an epoch."""
    if fmt not in FORMATS:
        raise BadRequest(
            f"unknown format {fmt!r} (supported: {', '.join(FORMATS)})", {"field": "format"}
        )
    check_path(path)
    with db.transaction() as s:
        # shared with GC's lock of the relation: it cannot pass the epoch before the pin
        rel = get_relation(s, name, share=True)
        epoch = readable_epoch(epoch, committed_epoch(s, rel.graph_id), rel.gc_epoch)
        x = Export(
            relation_id=rel.id,
            relation=rel.name,
            format=fmt,
            path=path,
            epoch=epoch,
            state=ExportState.QUEUED.value,
        )
        s.add(x)
        s.flush()
        s.add(EpochPin(relation_id=rel.id, holder=pin_holder(x.id), epoch=epoch))
        return x


def get_export(db: Database, export_id: int) -> Export:
    with db.transaction() as s:
        x = s.get(Export, export_id)
        if x is None:
            raise NotFound(f"export {export_id} does not exist", {"export_id": export_id})
        return x


def list_exports(db: Database, limit: int) -> list[Export]:
    """The newest ``limit`` exports, newest first."""
    with db.transaction() as s:
        return list(s.execute(select(Export).order_by(Export.id.desc()).limit(limit)).scalars())


def cancel_export(db: Database, export_id: int) -> Export:
    """Cancel a queued or running export (a cancelled one stays so); 409 once it ended
    otherwise. A running export's worker stops its Spark job at its next report."""
    with db.transaction() as s:
        x = s.execute(
            select(Export).where(Export.id == export_id).with_for_update()
        ).scalar_one_or_none()
        if x is None:
            raise NotFound(f"export {export_id} does not exist", {"export_id": export_id})
        state = ExportState(x.state)
        if state is ExportState.CANCELLED:
            return x
        if state.terminal:
            raise Conflict(f"export {export_id} already {state.value}", {"state": state.value})
        x.state = ExportState.CANCELLED.value
        x.finished_at = dt.datetime.now(dt.UTC)
        if state is ExportState.QUEUED:
            release_pin(s, x.id)  # (a running one's worker releases it once it stopped)
        return x
