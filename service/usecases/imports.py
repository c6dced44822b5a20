"""Imports: files loaded into a table by a worker's Spark job and published at one epoch
(``docs/api.md#imports``). Creating one checks what a worker cannot fix (the format,
the path's form, that the table exists and takes DML) and only queues it: a bad request
writes nothing, and an import writes nothing to its table until it is published."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from backfill_core.protocol import ImportState
from backfill_core.protocol.imports import FORMATS
from service.catalog.models import Import
from service.catalog.queries import get_relation
from service.db import Database
from service.errors import BadRequest, Conflict, NotFound
from service.usecases.exports import check_path


def create_import(db: Database, name: str, fmt: str, path: str) -> Import:
    """Queue the import of the ``fmt`` files at ``path`` into table ``name``."""
    if fmt not in FORMATS:
        raise BadRequest(
            f"unknown format {fmt!r} (supported: {', '.join(FORMATS)})", {"field": "format"}
        )
    check_path(path)
    with db.transaction() as s:
        rel = get_relation(s, name, share=True)
        if rel.kind != "table":
            raise Conflict(
                f"{name!r} is a materialized view and is read-only: import into a table",
                {"name": name},
            )
        x = Import(
            relation_id=rel.id,
            relation=rel.name,
            format=fmt,
            path=path,
            state=ImportState.QUEUED.value,
        )
        s.add(x)
        s.flush()
        return x


def get_import(db: Database, import_id: int) -> Import:
    with db.transaction() as s:
        x = s.get(Import, import_id)
        if x is None:
            raise NotFound(f"import {import_id} does not exist", {"import_id": import_id})
        return x


def list_imports(db: Database, limit: int) -> list[Import]:
    """The newest ``limit`` imports, newest first."""
    with db.transaction() as s:
        return list(s.execute(select(Import).order_by(Import.id.desc()).limit(limit)).scalars())


def cancel_import(db: Database, import_id: int) -> Import:
    """Cancel a queued or running import (a cancelled one stays so); 409 once it ended
    otherwise. A running import's worker stops its Spark job at its next report and its
    staging table is dropped then; an import being published waits for the publication
    to end (and is then succeeded or failed: 409)."""
    with db.transaction() as s:
        x = s.execute(
            select(Import).where(Import.id == import_id).with_for_update()
        ).scalar_one_or_none()
        if x is None:
            raise NotFound(f"import {import_id} does not exist", {"import_id": import_id})
        state = ImportState(x.state)
        if state is ImportState.CANCELLED:
            return x
        if state.terminal:
            raise Conflict(f"import {import_id} already {state.value}", {"state": state.value})
        x.state = ImportState.CANCELLED.value
        x.finished_at = dt.datetime.now(dt.UTC)
        return x
