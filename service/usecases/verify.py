"""Verification of a job's view: equal, at a committed epoch, to the view of its upstream
(a table at that epoch, or a source's messages up to its offsets at that epoch)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backfill_core.schema import TableSchema
from backfill_core.view import View
from connectors.kafka import KafkaClient, KafkaSpec, KafkaUnavailable, decode_messages
from service.catalog.models import Relation, Source
from service.catalog.queries import committed_epoch, load_job, storage_of
from service.db import Database, raw_cursor
from service.errors import Conflict, Unavailable
from service.meta.sources import offsets_at
from service.usecases.tables import readable_epoch


def _hashable(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v for v in row)


@dataclass(frozen=True)
class Verification:
    epoch: int
    equal: bool
    mv_rows: int
    expected_rows: int
    missing: list[dict[str, Any]]
    unexpected: list[dict[str, Any]]


def verify(db: Database, job_id: int, epoch: int | None, sample: int = 10) -> Verification:
    """Compare the MV at a committed epoch with the view of the upstream at that epoch."""
    with db.transaction() as s:
        job = load_job(s, job_id)
        if job.kind == "cdc":
            raise Conflict(
                f"job {job_id} mirrors an upstream Postgres table: there is no upstream of "
                "ours to verify its table against",
                {"kind": job.kind},
                code="job_is_cdc",
            )
        if job.upstream_source_id is not None:
            return _verify_source(db, job_id, epoch, sample)
    with db.snapshot() as s:  # GC may not move under the reads
        job = load_job(s, job_id)
        committed = committed_epoch(s, job.graph_id)
        up = s.get(Relation, job.upstream_relation_id)
        mv = s.get(Relation, job.mv_relation_id)
        assert up is not None and mv is not None
        epoch = readable_epoch(epoch, committed, max(up.gc_epoch, mv.gc_epoch))
        up_table, mv_table = storage_of(up), storage_of(mv)
        view = View.build(up_table.schema, job.columns, job.filter)
        cur = raw_cursor(s)
        full = (0, up_table.schema.vnode_count)
        expected = {
            _hashable(r) for r in view.rows([r for _, r in up_table.snapshot(cur, epoch, full)])
        }
        actual = [_hashable(r) for _, r in mv_table.snapshot(cur, epoch, full)]
        return _compare(expected, actual, epoch, mv_table.schema, sample)


def _compare(
    expected: set[Any], actual: list[Any], epoch: int, schema: TableSchema, sample: int
) -> Verification:
    actual_set = set(actual)
    duplicates = len(actual) != len(actual_set)

    def show(rows: set[Any]) -> list[dict[str, Any]]:
        return [
            schema.row_to_json(dict(zip(schema.names, r, strict=True)))
            for r in sorted(rows, key=repr)[:sample]
        ]

    missing, unexpected = expected - actual_set, actual_set - expected
    return Verification(
        epoch=epoch,
        equal=not missing and not unexpected and not duplicates,
        mv_rows=len(actual),
        expected_rows=len(expected),
        missing=show(missing),
        unexpected=show(unexpected),
    )


def _verify_source(db: Database, job_id: int, epoch: int | None, sample: int) -> Verification:
    """A source job's MV at a committed epoch holds every message the shared source had
    reached by then (the view of them), each exactly once."""
    with db.snapshot() as s:
        job = load_job(s, job_id)
        src = s.get(Source, job.upstream_source_id)
        mv = s.get(Relation, job.mv_relation_id)
        assert src is not None and mv is not None
        committed = committed_epoch(s, job.graph_id)
        epoch = readable_epoch(epoch, committed, mv.gc_epoch)
        ends = offsets_at(s, src, epoch)
        spec = KafkaSpec.from_json(src.kafka)
        up_schema = TableSchema.from_json(src.schema)
        view = View.build(up_schema, job.columns, job.filter)
        mv_table = storage_of(mv)
        full = (0, mv_table.schema.vnode_count)
        actual = [_hashable(r) for _, r in mv_table.snapshot(raw_cursor(s), epoch, full)]
    try:
        client = KafkaClient(spec)
        try:
            messages = [
                m for split, end in ends.items() for m in client.read(int(split), None, end)
            ]
        finally:
            client.close()
    except KafkaUnavailable as e:
        raise Unavailable(str(e), code="kafka_unavailable") from None
    # the invalid messages a source skips are not in its view (under ``fail`` the job failed)
    decoded = decode_messages(up_schema, messages)
    expected = {_hashable(r) for r in view.rows(decoded.rows)}
    return _compare(expected, actual, epoch, mv_table.schema, sample)
