"""Kafka, as the sources use it: topic metadata, watermarks, and reads by offset range.

Both sides use it: the control plane asks for partitions and high watermarks (to
advance the shared source at each barrier and to validate a new source), the workers
read messages by offset (the upstream rows of an epoch and the backfill). Every call
has a deadline: an unreachable broker is an error, never a hang.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import confluent_kafka as ck

from backfill_core.schema import Column, ColumnType, SchemaError, TableSchema, coerce_value

log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger("librdkafka")

PARTITION_COLUMN = "_partition"
OFFSET_COLUMN = "_offset"
METADATA_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
# client settings a source may not override: they are how the service reads
RESERVED_PROPERTIES = frozenset(
    {"bootstrap.servers", "group.id", "enable.auto.commit", "logger", "enable.partition.eof"}
)


# client settings whose values are secrets: stored and passed to the workers' clients,
# never shown (``redacted_properties``)
SECRET_MARK = "***"


def is_secret_property(name: str) -> bool:
    """Whether a client setting's value is a secret: ``*password*``, ``*secret*``,
    ``sasl.*`` or ``ssl.key*``."""
    n = name.lower()
    return "password" in n or "secret" in n or n.startswith("sasl.") or n.startswith("ssl.key")


def redacted_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """``properties`` as a reader may see them: secret values replaced by ``***``."""
    return {k: SECRET_MARK if is_secret_property(k) else v for k, v in properties.items()}


class KafkaUnavailable(Exception):
    """The brokers cannot be reached, or the topic does not exist."""


class KafkaConfigError(ValueError):
    """librdkafka refused the client settings (an unknown property, a bad value)."""


@dataclass(frozen=True)
class KafkaSpec:
    bootstrap_servers: str
    topic: str
    properties: Mapping[str, str]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KafkaSpec:
        return cls(
            str(data["bootstrap_servers"]),
            str(data["topic"]),
            {str(k): str(v) for k, v in (data.get("properties") or {}).items()},
        )

    def to_json(self) -> dict[str, Any]:
        """The inverse of ``from_json`` (how a Spark task gets the source's settings)."""
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "topic": self.topic,
            "properties": dict(self.properties),
        }

    def consumer_config(self) -> dict[str, Any]:
        return {
            # reads are short and bounded: a long-polling fetch at a partition's end
            # would hold up the next assignment by up to this long
            "fetch.wait.max.ms": 20,
            # librdkafka's default, made explicit: messages of aborted transactions are
            # never read, and the high watermark the brokers report is the last stable
            # offset, so nothing reads into a transaction still open (a source may
            # choose read_uncommitted: every reader of it uses these same settings)
            "isolation.level": "read_committed",
            **self.properties,
            "bootstrap.servers": self.bootstrap_servers,
            # offsets are the service's own state (committed with epochs), never Kafka's
            "group.id": "mv-backfill",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "logger": _librdkafka_log,
        }


@dataclass(frozen=True, slots=True)
class Message:
    partition: int
    offset: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Scanned:
    """A read of one partition: its messages, and ``end``: every message of the range
    below this offset is among them (past the last one when the offsets after it hold
    none: transaction markers, aborted or compacted messages)."""

    messages: list[Message]
    end: int


class KafkaClient:
    """One consumer for one topic; not thread-safe (one per thread)."""

    def __init__(self, spec: KafkaSpec) -> None:
        self.spec = spec
        try:
            self._consumer = ck.Consumer(spec.consumer_config())
        except ck.KafkaException as e:
            raise KafkaConfigError(f"invalid Kafka client settings: {e.args[0].str()}") from None

    def close(self) -> None:
        self._consumer.close()

    def partitions(self, timeout: float = METADATA_TIMEOUT_S) -> list[int]:
        try:
            md = self._consumer.list_topics(self.spec.topic, timeout=timeout)
        except ck.KafkaException as e:
            raise KafkaUnavailable(
                f"Kafka at {self.spec.bootstrap_servers!r} is unreachable: {e.args[0].str()}"
            ) from None
        topic = md.topics.get(self.spec.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            why = topic.error.str() if topic is not None and topic.error else "no partitions"
            raise KafkaUnavailable(f"topic {self.spec.topic!r} is not available: {why}")
        return sorted(topic.partitions)

    def watermarks(
        self, partitions: Sequence[int] | None = None, timeout: float = METADATA_TIMEOUT_S
    ) -> dict[int, tuple[int, int]]:
        """partition -> (low, high): the first offset, and one past the last."""
        parts = self.partitions(timeout) if partitions is None else partitions
        out = {}
        for p in parts:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    ck.TopicPartition(self.spec.topic, p), timeout=timeout, cached=False
                )
            except ck.KafkaException as e:
                raise KafkaUnavailable(f"watermarks of partition {p}: {e.args[0].str()}") from None
            out[p] = (int(low), int(high))
        return out

    def read(
        self, partition: int, start: int | None, stop: int, limit: int | None = None
    ) -> list[Message]:
        """Messages of ``partition`` from ``start`` (None: the earliest) up to ``stop``
        (exclusive), at most ``limit``; offsets may have gaps (compaction, markers)."""
        return self.read_ranges({partition: (start, stop, limit)})[partition]

    def read_ranges(
        self, ranges: Mapping[int, tuple[int | None, int, int | None]]
    ) -> dict[int, list[Message]]:
        """``read`` of several partitions at once (one assignment, one fetch stream):
        partition -> (start, stop, limit)."""
        return {p: s.messages for p, s in self.scan_ranges(ranges).items()}

    def scan_ranges(
        self, ranges: Mapping[int, tuple[int | None, int, int | None]]
    ) -> dict[int, Scanned]:
        """``read_ranges``, saying how far each read got (``Scanned.end``): to the stop
        unless the limit cut it short."""
        out: dict[int, list[Message]] = {p: [] for p in ranges}
        lows = [p for p, (start, _, _) in ranges.items() if start is None]
        earliest = self.watermarks(lows) if lows else {}
        todo: dict[int, tuple[int, int, int | None]] = {}
        following: dict[int, int] = {}  # next offset to expect
        for p, (start, stop, limit) in ranges.items():
            following[p] = first = earliest[p][0] if start is None else start
            if first < stop and (limit is None or limit > 0):
                todo[p] = (first, stop, limit)

        def scanned() -> dict[int, Scanned]:
            # a position past the stop says nothing about the offsets after it
            return {
                p: Scanned(out[p], min(following[p], todo[p][1]) if p in todo else following[p])
                for p in ranges
            }

        if not todo:
            return scanned()
        topic = self.spec.topic

        def done(p: int) -> bool:
            _, stop, limit = todo[p]
            return following[p] >= stop or (limit is not None and len(out[p]) >= limit)

        self._consumer.assign(
            [ck.TopicPartition(topic, p, first) for p, (first, _, _) in todo.items()]
        )
        deadline = time.monotonic() + READ_TIMEOUT_S
        paused: set[int] = set()
        try:
            while True:
                active = [p for p in todo if not done(p)]
                finished = [p for p in todo if p not in paused and p not in active]
                if finished:  # stop fetching what is not needed any more
                    self._consumer.pause([ck.TopicPartition(topic, p) for p in finished])
                    paused.update(finished)
                if not active:
                    return scanned()
                # never ask for more than the ranges can hold: consume() waits for the
                # full count (or its timeout)
                want = 0
                for p in active:
                    _, stop, limit = todo[p]
                    room = stop - following[p]
                    want += room if limit is None else min(room, limit - len(out[p]))
                for m in self._consumer.consume(min(10_000, want), timeout=0.2):
                    if m.error() is not None:
                        raise KafkaUnavailable(f"reading {topic}: {m.error().str()}")
                    p = m.partition()
                    if p not in todo or m.offset() < following[p] or done(p):
                        continue  # left over from an earlier assignment, or beyond the range
                    if m.offset() >= todo[p][1]:
                        following[p] = todo[p][1]
                        continue
                    out[p].append(Message(p, m.offset(), m.value()))
                    following[p] = m.offset() + 1
                # the position past the last message kept is a gap without messages, but
                # only while every message the consumer handed over was kept: one that
                # reached its limit dropped the rest, and its position is past them
                gaps = [ck.TopicPartition(topic, p) for p in active if not done(p)]
                for tp in self._consumer.position(gaps) if gaps else []:
                    if tp.offset > following[tp.partition]:
                        following[tp.partition] = tp.offset
                if time.monotonic() > deadline:
                    stops = {p: todo[p][1] for p in active}
                    raise KafkaUnavailable(
                        f"{topic}: offsets {dict(following)} not readable within "
                        f"{READ_TIMEOUT_S:.0f}s (reading up to {stops})"
                    )
        finally:
            if paused:  # pausing outlives the assignment: undo it for the next read
                self._consumer.resume([ck.TopicPartition(topic, p) for p in paused])
            self._consumer.unassign()


def backfill_stop(stop: int, target: int | None) -> int:
    """Where a backfill read of a split ends (exclusive): at ``stop`` (the high
    watermark), but never after its target, since no row after it can be visible."""
    return stop if target is None else min(stop, target + 1)


def topic_watermarks(spec: KafkaSpec) -> dict[int, tuple[int, int]]:
    """Every partition's (low, high) with a client of its own (raises KafkaUnavailable)."""
    client = KafkaClient(spec)
    try:
        return client.watermarks()
    finally:
        client.close()


def source_schema(columns: Sequence[Any], vnode_count: int) -> TableSchema:
    """The row a message becomes: its JSON fields, then its partition and offset (the key)."""
    cols = [*columns, Column(PARTITION_COLUMN, ColumnType.INT, False)]
    cols.append(Column(OFFSET_COLUMN, ColumnType.BIGINT, False))
    return TableSchema.build(
        cols, (PARTITION_COLUMN, OFFSET_COLUMN), None, vnode_count, allow_internal=True
    )


ON_ERROR = ("skip", "fail")
POISON_MARK = "poison message"


class PoisonMessage(ValueError):
    """A message that is not a valid row of its source, under ``on_error: fail``."""

    def __init__(self, partition: int, offset: int, reason: str) -> None:
        super().__init__(f"{POISON_MARK} at partition {partition} offset {offset}: {reason}")
        self.partition = partition
        self.offset = offset


def decode_row(schema: TableSchema, message: Message) -> tuple[Any, ...] | str:
    """A message as a row of ``schema``, or why it is not one: a value that is not a
    JSON object, or a field whose value does not fit its column. Missing fields are
    NULL."""
    if message.value is None:
        return "no value"
    try:
        doc = json.loads(message.value)
    except ValueError:
        return "not JSON"
    if not isinstance(doc, dict):
        return "not a JSON object"
    values: list[Any] = []
    for col in schema.columns:
        if col.name == PARTITION_COLUMN:
            values.append(message.partition)
        elif col.name == OFFSET_COLUMN:
            values.append(message.offset)
        else:
            raw = doc.get(col.name)
            try:
                values.append(None if raw is None else coerce_value(col.type, raw, col.name))
            except SchemaError as e:
                return f"field {col.name!r}: {e.message}"
    return tuple(values)


@dataclass(frozen=True, slots=True)
class Skipped:
    """Messages of one partition that are not rows: how many, the first and last offsets,
    and why the first is not."""

    partition: int
    count: int
    first_offset: int
    last_offset: int
    reason: str


@dataclass
class Decoded:
    rows: list[tuple[Any, ...]]
    skipped: list[Skipped]  # per partition


def decode_messages(schema: TableSchema, messages: Sequence[Message]) -> Decoded:
    """The rows of ``messages``, and the messages that are not rows (``decode_row``),
    which ``on_invalid`` judges by the source's ``on_error``."""
    out = Decoded([], [])
    bad: dict[int, Skipped] = {}
    for m in messages:
        row = decode_row(schema, m)
        if not isinstance(row, str):
            out.rows.append(row)
            continue
        was = bad.get(m.partition)
        if was is None:
            bad[m.partition] = Skipped(m.partition, 1, m.offset, m.offset, row)
        else:
            bad[m.partition] = Skipped(
                m.partition, was.count + 1, was.first_offset, m.offset, was.reason
            )
    out.skipped = list(bad.values())
    return out


def on_invalid(on_error: str, skipped: Sequence[Skipped]) -> None:
    """The source's policy for messages that are not rows, the one every reader applies
    (the worker's driver, and it again for what its Spark tasks read): ``fail`` raises
    ``PoisonMessage`` naming the first; ``skip`` lets the caller count them."""
    if on_error == "fail" and skipped:
        first = min(skipped, key=lambda x: (x.first_offset, x.partition))
        raise PoisonMessage(first.partition, first.first_offset, first.reason)
