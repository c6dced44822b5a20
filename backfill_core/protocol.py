"""The worker protocol's contract shared by the control plane and the workers.

Errors are told apart by code: the control plane puts one of ``ErrorCode`` in an error
body's ``code`` (``{"error": {"code", "message", "details"}}``), the worker's client
decodes it once (``ErrorBody.from_json``) and the worker branches on the code. The
message is for people and may change freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """What a worker request can be refused for, beyond malformed input."""

    # 409: a collect from an earlier incarnation of its graph (a recovery since)
    STALE_COLLECT = "stale_collect"
    # 409: a collect of a barrier that is not in flight for the actor (a recovery forgot it)
    STALE_BARRIER = "stale_barrier"
    # 409: a collect for an actor that is not this worker's (unknown, another worker's, or
    # deleted meanwhile by a drop or a rescale); ``details.actor_id`` names it
    ACTOR_NOT_ASSIGNED = "actor_not_assigned"
    # 404: no worker of that id ever registered
    UNKNOWN_WORKER = "unknown_worker"
    # 410: the worker was declared dead (its lease expired) or stopped: register again
    WORKER_GONE = "worker_gone"


# Refusals that mean the actor's graph recovered past its collect: the actor waits for
# the recovery's initial barrier (no failure of the worker: reporting one would only
# recover the graph again)
SUPERSEDED = frozenset({ErrorCode.STALE_COLLECT, ErrorCode.STALE_BARRIER})


@dataclass(frozen=True)
class ErrorBody:
    """An error answer of the API, decoded."""

    code: str
    message: str
    details: Any = None

    @property
    def protocol_code(self) -> ErrorCode | None:
        """The protocol's code, or None for others (validation, internal, a proxy's page)."""
        try:
            return ErrorCode(self.code)
        except ValueError:
            return None

    @property
    def actor_id(self) -> int | None:
        """The actor the error is about, when it names one."""
        actor = self.details.get("actor_id") if isinstance(self.details, dict) else None
        return actor if isinstance(actor, int) and not isinstance(actor, bool) else None

    @classmethod
    def from_json(cls, body: object) -> ErrorBody:
        """Any answer's body: one not in the API's error format (a proxy's page, plain
        text) has no code and its text as the message."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("code"), str):
            return cls("", body if isinstance(body, str) else repr(body))
        return cls(error["code"], str(error.get("message", "")), error.get("details"))

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


# The assignment of an actor, as the poll hands it out ----------------------------------
# Frozen dataclasses rather than pydantic: the core imports only the standard library
# (tests/unit/test_core_is_pure.py), and both sides already exchange this JSON (the
# service serializes it with pydantic's encoder, the worker with httpx's json).


@dataclass(frozen=True)
class SourceRef:
    """The source a job reads (instead of a table)."""

    id: int
    kafka: dict[str, Any]  # its connection (``connectors.kafka.KafkaSpec`` JSON)


@dataclass(frozen=True)
class JobSpec:
    """A job as its actors' workers need it. Schemas stay in their JSON form
    (``backfill_core.schema.TableSchema.from_json``): the control plane copies them from
    the catalog's rows without parsing them, ten times a second."""

    id: int
    name: str
    kind: str  # arrangement, chain, snapshot or source
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

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobSpec:
        src = d.get("source")
        return cls(
            id=int(d["id"]),
            name=str(d["name"]),
            kind=str(d["kind"]),
            state=str(d["state"]),
            upstream_table=d.get("upstream_table"),
            upstream_schema=d.get("upstream_schema"),
            source=SourceRef(int(src["id"]), src["kafka"]) if src else None,
            mv_table=str(d["mv_table"]),
            mv_schema=d["mv_schema"],
            columns=[str(c) for c in d["columns"]],
            filter=d.get("filter"),
            rate_limit=d.get("rate_limit"),
            paused=bool(d.get("paused", False)),
            snapshot_epoch=d.get("snapshot_epoch"),
        )

    def to_json(self) -> dict[str, Any]:
        src = self.source
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "upstream_table": self.upstream_table,
            "upstream_schema": self.upstream_schema,
            "source": {"id": src.id, "kafka": src.kafka} if src else None,
            "mv_table": self.mv_table,
            "mv_schema": self.mv_schema,
            "columns": self.columns,
            "filter": self.filter,
            "rate_limit": self.rate_limit,
            "paused": self.paused,
            "snapshot_epoch": self.snapshot_epoch,
        }


@dataclass(frozen=True)
class VnodeRestore:
    """A vnode's committed progress (table jobs)."""

    vnode: int
    state: str
    current_pos: list[Any] | None  # the last primary key read, as JSON values
    row_count: int
    epoch: int | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VnodeRestore:
        epoch = d.get("epoch")
        return cls(
            int(d["vnode"]),
            str(d["state"]),
            d.get("current_pos"),
            int(d.get("row_count") or 0),
            None if epoch is None else int(epoch),
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
    """A split's committed progress (source jobs)."""

    split: str
    state: str
    offset: int | None
    num_consumed_rows: int
    target_offset: int | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SplitRestore:
        offset, target = d.get("offset"), d.get("target_offset")
        return cls(
            str(d["split"]),
            str(d["state"]),
            None if offset is None else int(offset),
            int(d.get("num_consumed_rows") or 0),
            None if target is None else int(target),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "state": self.state,
            "offset": self.offset,
            "num_consumed_rows": self.num_consumed_rows,
            "target_offset": self.target_offset,
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
    barriers: list[dict[str, Any]]
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
            barriers=list(d.get("barriers") or ()),
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
            "barriers": self.barriers,
            "restore": None if self.restore is None else self.restore.to_json(),
        }


@dataclass(frozen=True)
class PollAnswer:
    worker_id: int
    lease_ms: int
    assignments: list[Assignment]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PollAnswer:
        return cls(
            int(d["worker_id"]),
            int(d["lease_ms"]),
            [Assignment.from_json(a) for a in d.get("assignments") or ()],
        )
