"""Use cases for Kafka sources: create (after checking the topic), list, read, drop.

A source's rows are its messages: the JSON fields named by its columns, plus the
partition and offset they came from (the key). The shared source starts at the topic's
end when it is created; jobs reading it backfill everything before
(``docs/architecture.md#sources-kafka``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from backfill_core.schema import Column, SchemaError, validate_identifier
from connectors.kafka import (
    RESERVED_PROPERTIES,
    KafkaConfigError,
    KafkaSpec,
    KafkaUnavailable,
    topic_watermarks,
)
from connectors.kafka import source_schema as build_schema
from service.catalog import idempotency
from service.catalog.models import Job, Source
from service.catalog.queries import ACTIVE_JOB_STATES, get_source
from service.db import Database
from service.errors import Conflict, Invalid

TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _check_kafka(bootstrap_servers: str, topic: str, properties: Mapping[str, Any]) -> KafkaSpec:
    if not bootstrap_servers.strip():
        raise Invalid("kafka.bootstrap_servers must not be empty", {"field": "kafka"})
    if not TOPIC_RE.match(topic) or topic in (".", ".."):
        raise Invalid(
            f"invalid Kafka topic name {topic!r}: 1 to 249 of A-Z a-z 0-9 . _ -",
            {"field": "kafka.topic"},
        )
    reserved = sorted(set(properties) & RESERVED_PROPERTIES)
    if reserved:
        raise Invalid(
            f"kafka.properties may not set {', '.join(reserved)}: the service sets them",
            {"field": "kafka.properties"},
        )
    return KafkaSpec(bootstrap_servers, topic, {str(k): str(v) for k, v in properties.items()})


def create_source(
    db: Database,
    name: str,
    kafka: Mapping[str, Any],
    columns: Sequence[Column],
    rate_limit: int | None,
    vnode_count: int,
    claim: idempotency.Claim | None = None,
    on_error: str = "skip",
) -> Source:
    try:
        validate_identifier(name, "source name")
        for i, col in enumerate(columns):
            try:  # `_partition` and `_offset` are the service's (names may not start with _)
                validate_identifier(col.name, "column name")
            except SchemaError as e:
                raise SchemaError(e.message, f"columns[{i}].name") from None
        schema = build_schema(columns, vnode_count)
    except SchemaError as e:
        raise Invalid(e.message, {"field": e.path or "name"}) from None
    spec = _check_kafka(
        str(kafka["bootstrap_servers"]), str(kafka["topic"]), kafka.get("properties") or {}
    )
    # reach the topic before writing anything: a bad address is a clear error, not a
    # source that never advances
    try:
        marks = topic_watermarks(spec)
    except KafkaConfigError as e:
        raise Invalid(str(e), {"field": "kafka.properties"}) from None
    except KafkaUnavailable as e:
        raise Invalid(str(e), {"field": "kafka"}, code="kafka_unavailable") from None
    try:
        with db.transaction() as s:
            if claim is not None:
                idempotency.claim(s, claim)
            if s.execute(select(Source.id).where(Source.name == name)).first():
                raise Conflict(f"source {name!r} already exists", {"name": name})
            src = Source(
                name=name,
                kafka={
                    "bootstrap_servers": spec.bootstrap_servers,
                    "topic": spec.topic,
                    "properties": dict(spec.properties),
                },
                format="json",
                schema=schema.to_json(),
                rate_limit=rate_limit,
                on_error=on_error,
                start_offsets={str(p): high for p, (_low, high) in marks.items()},
            )
            s.add(src)
            s.flush()
            idempotency.created(s, claim, {"source": name})
            return src
    except IntegrityError:
        raise Conflict(f"source {name!r} already exists", {"name": name}) from None


def list_sources(db: Database) -> list[Source]:
    with db.transaction() as s:
        return list(s.execute(select(Source).order_by(Source.name)).scalars())


def read_source(db: Database, name: str) -> Source:
    with db.transaction() as s:
        return get_source(s, name)


def drop_source(db: Database, name: str) -> None:
    with db.transaction() as s:
        src = get_source(s, name, lock=True)
        readers = list(
            s.execute(
                select(Job.name).where(
                    Job.upstream_source_id == src.id, Job.state.in_(ACTIVE_JOB_STATES)
                )
            ).scalars()
        )
        if readers:
            raise Conflict(
                f"source {name!r} is read by job(s) {', '.join(readers)}", {"jobs": readers}
            )
        # finished jobs keep their views; they just stop naming the source
        s.execute(
            update(Job).where(Job.upstream_source_id == src.id).values(upstream_source_id=None)
        )
        s.delete(src)
