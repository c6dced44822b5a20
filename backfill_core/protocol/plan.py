"""The plan of a Spark job: what its tasks read and where they write the view.

The worker's driver builds one (``spark_workers.spark_path``) and hands it to the
tasks as JSON text, a Spark option or a task's argument; the tasks decode it here
(``spark_workers.datasource``, ``pushdown_tasks``, ``kafka_datasource``). Two kinds:
``TablePlan`` reads a table's snapshot (rows moved through Spark, or groups of reads
pushed down into Postgres, for one epoch or as rounds spanning epochs) and
``KafkaPlan`` reads offset ranges of a source's Kafka partitions. The reads are tuples,
so they are JSON arrays on the wire (a plan carries thousands of them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from backfill_core.schema import TableSchema, coerce_value


@dataclass(frozen=True)
class MvWrite:
    """Where and how every Spark job writes the view: the job's MV, its view (columns
    and filter), at the open epoch, fenced by the graph's incarnation."""

    dsn: str
    mv_table: str
    mv_schema: TableSchema
    columns: list[str]
    filter: Any  # the view's filter expression (``backfill_core.view``), or None
    graph_id: int
    recovery_seq: int
    write_epoch: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MvWrite:
        return cls(
            str(d["dsn"]),
            str(d["mv_table"]),
            TableSchema.from_json(d["mv_schema"]),
            [str(c) for c in d["columns"]],
            d.get("filter"),
            int(d["graph_id"]),
            int(d["recovery_seq"]),
            int(d["write_epoch"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "dsn": self.dsn,
            "mv_table": self.mv_table,
            "mv_schema": self.mv_schema.to_json(),
            "columns": self.columns,
            "filter": self.filter,
            "graph_id": self.graph_id,
            "recovery_seq": self.recovery_seq,
            "write_epoch": self.write_epoch,
        }


class VnodeRead(NamedTuple):
    """A read of one vnode after a key (None: from its start), up to ``limit`` rows."""

    vnode: int
    after: list[Any] | None  # a key, as JSON values
    limit: int


class GroupStart(NamedTuple):
    vnode: int
    after: list[Any] | None


class ReadGroup(NamedTuple):
    """Vnodes read one after the other under one limit (one pushed-down statement)."""

    limit: int
    starts: list[GroupStart]


def _key(value: Any) -> list[Any] | None:
    return None if value is None else list(value)


@dataclass(frozen=True)
class TablePlan:
    """A snapshot read of a table at ``read_epoch``: per Spark partition its vnode reads
    (rows moved through Spark), or, pushed down, ``groups`` that the tasks take in turn
    from work queue ``queue`` (a token of ``work_queues``); with ``rounds``, each group
    is a round at the epochs the driver releases in the queue's row
    (``spark_workers.rounds``), not at the plan's."""

    write: MvWrite
    upstream_table: str
    upstream_schema: TableSchema
    read_epoch: int
    partitions: list[list[VnodeRead]] = field(default_factory=list)
    groups: list[ReadGroup] | None = None
    queue: str | None = None
    rounds: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TablePlan:
        groups = d.get("groups")
        return cls(
            MvWrite.from_json(d),
            str(d["upstream_table"]),
            TableSchema.from_json(d["upstream_schema"]),
            int(d["read_epoch"]),
            [
                [VnodeRead(int(v), _key(a), int(n)) for v, a, n in p]
                for p in d.get("partitions") or ()
            ],
            None
            if groups is None
            else [
                ReadGroup(int(limit), [GroupStart(int(v), _key(a)) for v, a in starts])
                for limit, starts in groups
            ],
            d.get("queue"),
            bool(d.get("rounds", False)),
        )

    def to_json(self) -> dict[str, Any]:
        out = self.write.to_json() | {
            "upstream_table": self.upstream_table,
            "upstream_schema": self.upstream_schema.to_json(),
            "read_epoch": self.read_epoch,
            "partitions": self.partitions,
        }
        if self.groups is not None:
            out["groups"] = self.groups
        if self.queue is not None:
            out["queue"] = self.queue
        if self.rounds:
            out["rounds"] = True
        return out

    @classmethod
    def from_text(cls, text: str) -> TablePlan:
        return cls.from_json(json.loads(text))

    def to_text(self) -> str:
        return json.dumps(self.to_json())

    def pk_from_json(self, value: list[Any] | None) -> tuple[Any, ...] | None:
        """A key of the upstream from its JSON values."""
        if value is None:
            return None
        types = self.upstream_schema.pk_types
        return tuple(coerce_value(t, x) for t, x in zip(types, value, strict=True))


class KafkaRange(NamedTuple):
    """A read of one Kafka partition's offsets in [start, stop) (start None: its
    earliest), up to ``limit`` messages, backfilling up to ``target``."""

    read: int  # the read's index in the job (its summary names it)
    partition: int
    start: int | None
    stop: int
    limit: int
    target: int | None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class KafkaPlan:
    """A source backfill's reads: per Spark partition its Kafka ranges
    (``spark_workers.kafka_datasource``)."""

    write: MvWrite
    kafka: dict[str, Any]  # the source's connection (``connectors.kafka.KafkaSpec`` JSON)
    upstream_schema: TableSchema  # the source's
    partitions: list[list[KafkaRange]] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> KafkaPlan:
        return cls(
            MvWrite.from_json(d),
            dict(d["kafka"]),
            TableSchema.from_json(d["upstream_schema"]),
            [
                [
                    KafkaRange(int(i), int(p), _opt_int(start), int(stop), int(n), _opt_int(t))
                    for i, p, start, stop, n, t in part
                ]
                for part in d.get("partitions") or ()
            ],
        )

    def to_json(self) -> dict[str, Any]:
        return self.write.to_json() | {
            "kafka": self.kafka,
            "upstream_schema": self.upstream_schema.to_json(),
            "partitions": self.partitions,
        }

    @classmethod
    def from_text(cls, text: str) -> KafkaPlan:
        return cls.from_json(json.loads(text))

    def to_text(self) -> str:
        return json.dumps(self.to_json())
