"""Imports: files loaded into a table by a worker's Spark job and published at one epoch
(``docs/api.md#imports``). Creating one checks what a worker cannot fix (the format,
the path's form, that the table exists and takes DML) and only queues it: a bad request
writes nothing, and an import writes nothing to its table until it is published."""

from __future__ import annotations

from backfill_core.protocol import ImportState
from backfill_core.protocol.imports import FORMATS
from service.catalog.models import Import
from service.catalog.queries import get_relation
from service.db import Database
from service.errors import Conflict
from service.usecases import claimed
from service.usecases.claimed import check_format, check_path
from service.usecases.tables import refuse_mirrored


def create_import(db: Database, name: str, fmt: str, path: str) -> Import:
    """Queue the import of the ``fmt`` files at ``path`` into table ``name``."""
    check_format(fmt, FORMATS)
    check_path(path)
    with db.transaction() as s:
        rel = get_relation(s, name, share=True)
        if rel.kind != "table":
            raise Conflict(
                f"{name!r} is a materialized view and is read-only: import into a table",
                {"name": name},
            )
        refuse_mirrored(s, rel)
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
    return claimed.get(db, Import, "import", import_id)


def list_imports(db: Database, limit: int) -> list[Import]:
    """The newest ``limit`` imports, newest first."""
    return claimed.newest(db, Import, limit)


def cancel_import(db: Database, import_id: int) -> Import:
    """Cancel a queued or running import (a cancelled one stays so); 409 once it ended
    otherwise. A running import's worker stops its Spark job at its next report and its
    staging table is dropped then; an import being published waits for the publication
    to end (and is then succeeded or failed: 409)."""
    return claimed.cancel(db, Import, "import", import_id)
