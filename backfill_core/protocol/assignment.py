"""The poll's answer: a worker's actors, each with its job, its barriers and the
progress it restarts from (``docs/architecture.md#the-loop-and-the-protocol``).

Frozen dataclasses rather than pydantic: the core imports only the standard library
(tests/unit/test_core_is_pure.py). The control plane validates requests with pydantic
models at its edge (``service.api.workers``) and hands these types on; its answers are
these types' ``to_json``, and the worker decodes them once (``spark_workers.client``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from backfill_core.epoch import EpochPair
from backfill_core.executors.messages import Barrier, BarrierKind, Mutation
from backfill_core.protocol.decode import integer, items, obj, opt_integer, text


@dataclass(frozen=True)
class SourceRef:
    """The source a job reads (instead of a table)."""

    id: int
    kafka: dict[str, Any]  # its connection (``connectors.kafka.KafkaSpec`` JSON)
    on_error: str = "skip"  # a message that is not a valid row: skip | fail


@dataclass(frozen=True)
class CdcRef:
    """The upstream a CDC table's job mirrors (``kind == "cdc"``): its table of ours is
    the job's ``mv_table``; its durable progress is in the catalog (``cdc_tables``)."""

    relation_id: int
    dsn: str  # a secret: the worker connects with it, and never logs it
    table: str  # schema.table upstream
    publication: str
    slot: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CdcRef:
        return cls(
            int(d["relation_id"]),
            str(d["dsn"]),
            str(d["table"]),
            str(d["publication"]),
            str(d["slot"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "relation_id": self.relation_id,
            "dsn": self.dsn,
            "table": self.table,
            "publication": self.publication,
            "slot": self.slot,
        }

    def __repr__(self) -> str:  # never the DSN
        return f"CdcRef({self.relation_id}, {self.table!r}, {self.publication!r}, {self.slot!r})"


@dataclass(frozen=True)
class JobSpec:
    """A job as its actors' workers need it. Schemas stay in their JSON form
    (``backfill_core.schema.TableSchema.from_json``): the control plane copies them from
    the catalog's rows without parsing them, ten times a second."""

    id: int
    name: str
    kind: str  # arrangement, chain, snapshot, source or cdc
    state: str
    upstream_table: str | None  # storage table of the upstream (None: a source)
    upstream_schema: dict[str, Any] | None  # of the upstream table or the source
    source: SourceRef | None
    mv_table: str
    mv_schema: dict[str, Any]
    columns: list[str]  # of the upstream, in the view
    filter: Any  # the view's filter expression (``backfill_core.view``), or None
    rate_limit: int | None
    paused: bool
    snapshot_epoch: int | None
    cdc: CdcRef | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobSpec:
        src = d.get("source")
        mirror = d.get("cdc")
        return cls(
            id=int(d["id"]),
            name=str(d["name"]),
            kind=str(d["kind"]),
            state=str(d["state"]),
            upstream_table=d.get("upstream_table"),
            upstream_schema=d.get("upstream_schema"),
            source=(
                SourceRef(int(src["id"]), src["kafka"], str(src.get("on_error", "skip")))
                if src
                else None
            ),
            mv_table=str(d["mv_table"]),
            mv_schema=d["mv_schema"],
            columns=[str(c) for c in d["columns"]],
            filter=d.get("filter"),
            rate_limit=d.get("rate_limit"),
            paused=bool(d.get("paused", False)),
            snapshot_epoch=d.get("snapshot_epoch"),
            cdc=CdcRef.from_json(mirror) if mirror else None,
        )

    def to_json(self) -> dict[str, Any]:
        """Its JSON, built once: a poll answers with the job of each of its actors, and
        the actors of a job share its spec (``service.meta.workers``). Not to be changed."""
        return self._json

    @cached_property
    def _json(self) -> dict[str, Any]:
        src = self.source
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "upstream_table": self.upstream_table,
            "upstream_schema": self.upstream_schema,
            "source": (
                {"id": src.id, "kafka": src.kafka, "on_error": src.on_error} if src else None
            ),
            "mv_table": self.mv_table,
            "mv_schema": self.mv_schema,
            "columns": self.columns,
            "filter": self.filter,
            "rate_limit": self.rate_limit,
            "paused": self.paused,
            "snapshot_epoch": self.snapshot_epoch,
            "cdc": self.cdc.to_json() if self.cdc is not None else None,
        }


@dataclass(frozen=True)
class VnodeRestore:
    """A vnode's progress (table jobs): reported by a collect, committed by the meta and
    restored from with an initial barrier."""

    vnode: int
    state: str
    current_pos: list[Any] | None = None  # the last primary key read, as JSON values
    row_count: int = 0
    epoch: int | None = None  # snapshot backfill: the epoch it is consumed at

    @classmethod
    def from_json(cls, data: Any) -> VnodeRestore:
        d = obj(data, "a vnode's progress")
        pos = d.get("current_pos")
        return cls(
            integer(d, "vnode"),
            text(d, "state"),
            None if pos is None else list(items(pos, "current_pos")),
            integer(d, "row_count", 0),
            opt_integer(d, "epoch"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "vnode": self.vnode,
            "state": self.state,
            "current_pos": self.current_pos,
            "row_count": self.row_count,
            "epoch": self.epoch,
        }


@dataclass(frozen=True)
class SplitRestore:
    """A split's progress (source jobs): reported by a collect, committed by the meta
    and restored from with an initial barrier."""

    split: str
    state: str
    offset: int | None = None
    num_consumed_rows: int = 0
    target_offset: int | None = None
    skipped: int = 0  # messages that are not rows (``on_error: skip``)
    last_skipped_offset: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> SplitRestore:
        d = obj(data, "a split's progress")
        return cls(
            text(d, "split"),
            text(d, "state"),
            opt_integer(d, "offset"),
            integer(d, "num_consumed_rows", 0),
            opt_integer(d, "target_offset"),
            integer(d, "skipped", 0),
            opt_integer(d, "last_skipped_offset"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "state": self.state,
            "offset": self.offset,
            "num_consumed_rows": self.num_consumed_rows,
            "target_offset": self.target_offset,
            "skipped": self.skipped,
            "last_skipped_offset": self.last_skipped_offset,
        }


@dataclass(frozen=True)
class RestoreState:
    """Committed progress of an actor's vnodes or splits, sent with its first or
    initial barrier to restart from."""

    vnodes: tuple[VnodeRestore, ...] = ()
    splits: tuple[SplitRestore, ...] = ()
    finished: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RestoreState:
        return cls(
            tuple(VnodeRestore.from_json(v) for v in d.get("vnodes") or ()),
            tuple(SplitRestore.from_json(s) for s in d.get("splits") or ()),
            bool(d.get("finished", False)),
        )

    def to_json(self) -> dict[str, Any]:
        # one of the two lists, as the actor has vnodes or splits
        out: dict[str, Any] = {"finished": self.finished}
        if self.splits:
            out["splits"] = [s.to_json() for s in self.splits]
        else:
            out["vnodes"] = [v.to_json() for v in self.vnodes]
        return out


def _range(r: Any) -> tuple[int, int]:
    start, end = r
    return int(start), int(end)


@dataclass(frozen=True)
class BarrierMessage:
    """A barrier as a worker receives it. ``mutation`` stays in the meta's JSON (it is
    rare, and the poll copies it from the catalog's rows); ``barrier`` is the decoded
    form the executors take."""

    prev: int
    curr: int
    kind: BarrierKind
    mutation: Mapping[str, Any] | None = None
    # creating graphs: the upstream's committed epoch when it was injected
    upstream_epoch: int | None = None
    # jobs reading a source: split -> [start, end) offsets of the source's messages in
    # the epoch this barrier opens
    source_ranges: Mapping[str, tuple[int, int]] | None = None

    @cached_property
    def barrier(self) -> Barrier:
        """As the executors take it."""
        return Barrier(
            EpochPair(self.prev, self.curr), self.kind, Mutation.from_json(self.mutation)
        )

    def adds(self, actor_id: int) -> bool:
        """Whether the barrier's mutation adds the actor (a rescale starts it)."""
        change = self.barrier.mutation
        return change is not None and actor_id in change.add

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BarrierMessage:
        upstream, ranges = d.get("upstream_epoch"), d.get("source_ranges")
        return cls(
            int(d["prev"]),
            int(d["curr"]),
            BarrierKind(d["kind"]),
            d.get("mutation"),
            None if upstream is None else int(upstream),
            None if ranges is None else {str(s): _range(r) for s, r in ranges.items()},
        )

    def to_json(self) -> dict[str, Any]:
        ranges = self.source_ranges
        return {
            "prev": self.prev,
            "curr": self.curr,
            "kind": self.kind.value,
            "mutation": self.mutation,
            "upstream_epoch": self.upstream_epoch,
            "source_ranges": None
            if ranges is None
            else {s: [start, end] for s, (start, end) in ranges.items()},
        }


@dataclass(frozen=True)
class Assignment:
    """One of a worker's actors with the barriers ready for it (its poll's answer)."""

    actor_id: int
    job_id: int
    graph_id: int
    recovery_seq: int
    vnodes: list[list[int]]  # [lo, hi) ranges
    splits: list[str]
    job: JobSpec
    barriers: list[BarrierMessage]
    restore: RestoreState | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Assignment:
        restore = d.get("restore")
        return cls(
            actor_id=int(d["actor_id"]),
            job_id=int(d["job_id"]),
            graph_id=int(d["graph_id"]),
            recovery_seq=int(d["recovery_seq"]),
            vnodes=[[int(lo), int(hi)] for lo, hi in d.get("vnodes") or ()],
            splits=[str(s) for s in d.get("splits") or ()],
            job=JobSpec.from_json(d["job"]),
            barriers=[BarrierMessage.from_json(b) for b in d.get("barriers") or ()],
            restore=None if restore is None else RestoreState.from_json(restore),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "actor_id": self.actor_id,
            "job_id": self.job_id,
            "graph_id": self.graph_id,
            "recovery_seq": self.recovery_seq,
            "vnodes": self.vnodes,
            "splits": self.splits,
            "job": self.job.to_json(),
            "barriers": [b.to_json() for b in self.barriers],
            "restore": None if self.restore is None else self.restore.to_json(),
        }


@dataclass(frozen=True)
class PollAnswer:
    """A worker's actors with the barriers ready for them (a poll's answer)."""

    worker_id: int
    lease_ms: int
    assignments: list[Assignment] = field(default_factory=list)

    @property
    def has_barriers(self) -> bool:
        return any(a.barriers for a in self.assignments)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PollAnswer:
        return cls(
            int(d["worker_id"]),
            int(d["lease_ms"]),
            [Assignment.from_json(a) for a in d.get("assignments") or ()],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "lease_ms": self.lease_ms,
            "assignments": [a.to_json() for a in self.assignments],
        }
