"""What exports and imports share as a client sees them (``service.usecases.exports``,
``service.usecases.imports``): the checks of a format and a path, and reading, listing
and cancelling the rows a worker claims and runs."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from backfill_core.protocol import TaskState
from service.db import Database
from service.errors import BadRequest, Conflict, NotFound
from service.meta import claimed
from service.meta.claimed import Row

# where Spark reads and writes with its bundled file systems (file:) or the cluster's connectors
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


def check_format(fmt: str, formats: Sequence[str]) -> None:
    if fmt not in formats:
        raise BadRequest(
            f"unknown format {fmt!r} (supported: {', '.join(formats)})", {"field": "format"}
        )


def get(db: Database, model: type[Row], kind: str, task_id: int) -> Row:
    """The row ``task_id``; 404 when there is none (``kind``: ``export``, ``import``)."""
    with db.transaction() as s:
        x = s.get(model, task_id)
        if x is None:
            raise NotFound(f"{kind} {task_id} does not exist", {f"{kind}_id": task_id})
        return x


def newest(db: Database, model: type[Row], limit: int) -> list[Row]:
    """The newest ``limit`` rows, newest first."""
    with db.transaction() as s:
        return list(s.execute(select(model).order_by(model.id.desc()).limit(limit)).scalars())


def cancel(
    db: Database,
    model: type[Row],
    kind: str,
    task_id: int,
    *,
    was_queued: Callable[[Session, Row], None] | None = None,
) -> Row:
    """Cancel a queued or running row (a cancelled one stays so); 409 once it ended
    otherwise. ``was_queued`` is called on a row cancelled before a worker claimed it."""
    with db.transaction() as s:
        x = claimed.lock(s, model, kind, task_id)
        state = TaskState(x.state)
        if state is TaskState.CANCELLED:
            return x
        if state.terminal:
            raise Conflict(f"{kind} {task_id} already {state.value}", {"state": state.value})
        x.state = TaskState.CANCELLED.value
        x.finished_at = dt.datetime.now(dt.UTC)
        if state is TaskState.QUEUED and was_queued is not None:
            was_queued(s, x)
        return x
