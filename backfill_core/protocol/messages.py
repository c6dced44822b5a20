"""The worker's requests besides the poll, and their answers: registration, collect
(one or a batch, with the actor's per-vnode or per-split progress) and failure report.

The control plane checks a request's bounds at its edge (``service.api.workers``: the
pydantic models there are the HTTP schema, decoded into these once); the meta and the
worker see these types only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from backfill_core.protocol.assignment import SplitRestore, VnodeRestore
from backfill_core.protocol.decode import MalformedMessage, boolean, get, integer, items, obj


@dataclass(frozen=True)
class RegisterRequest:
    name: str
    capacity: int = 4  # actors it can run

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RegisterRequest:
        return cls(str(d["name"]), int(d.get("capacity", 4)))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "capacity": self.capacity}


@dataclass(frozen=True)
class Registration:
    worker_id: int
    lease_ms: int
    database_url: str  # where the worker reads and writes the state store

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Registration:
        return cls(int(d["worker_id"]), int(d["lease_ms"]), str(d["database_url"]))

    def to_json(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "lease_ms": self.lease_ms,
            "database_url": self.database_url,
        }


_ROWS = ("vnodes", "splits")
# each row's members: its type, and whether it may be absent or null
_VNODE_ROW = (
    ("vnode", int, False),
    ("state", str, False),
    ("current_pos", list, True),
    ("row_count", int, True),
    ("epoch", int, True),
)
_SPLIT_ROW = (
    ("split", str, False),
    ("state", str, False),
    ("offset", int, True),
    ("num_consumed_rows", int, True),
    ("target_offset", int, True),
    ("skipped", int, True),
    ("last_skipped_offset", int, True),
)


def _check_rows(rows: Any, what: str, members: tuple[tuple[str, type, bool], ...]) -> None:
    """Each of ``rows`` an object of ``members``, of their types, and nothing else (a
    type test per member, no object built: a batch of collects carries thousands)."""
    names = frozenset(name for name, _, _ in members)
    for row in items(rows, what):
        if type(row) is not dict or not row.keys() <= names:
            raise MalformedMessage(f"a row of {what} is not an object of {sorted(names)}")
        for name, kind, optional in members:
            value = row.get(name)
            # exact types: a JSON true is no integer
            if type(value) is not kind and (value is not None or not optional):
                raise MalformedMessage(f"{what}: {name} is not of type {kind.__name__}")


@dataclass(frozen=True, eq=False)
class CollectProgress:
    """An actor's progress at a barrier: its vnodes' (table jobs) or its splits' (source
    jobs), which the meta commits with the barrier (``service.meta.barriers``), and the
    rest of its executor's report (``phase``, a snapshot backfill's figures), which the
    meta reads as it is (``service.meta.creating``).

    Kept as its JSON, checked (``from_json``) or built from typed rows (``of``): the meta
    stores it as it is, and a batch of collects carries thousands of rows, which took
    longer to build as objects than to parse. The rows are decoded when asked for."""

    _json: Mapping[str, Any]

    @classmethod
    def of(
        cls,
        vnodes: Sequence[VnodeRestore] | None = None,
        splits: Sequence[SplitRestore] | None = None,
        report: Mapping[str, Any] | None = None,
    ) -> CollectProgress:
        out = {k: v for k, v in (report or {}).items() if k not in _ROWS}
        if vnodes is not None:
            out["vnodes"] = [v.to_json() for v in vnodes]
        if splits is not None:
            out["splits"] = [s.to_json() for s in splits]
        return cls(out)

    @classmethod
    def from_json(cls, data: Any) -> CollectProgress:
        d = obj(data, "progress")
        if d.get("vnodes") is not None:
            _check_rows(d["vnodes"], "vnodes", _VNODE_ROW)
        if d.get("splits") is not None:
            _check_rows(d["splits"], "splits", _SPLIT_ROW)
        return cls(dict(d))

    def to_json(self) -> dict[str, Any]:
        return dict(self._json)

    @cached_property
    def vnodes(self) -> tuple[VnodeRestore, ...] | None:
        rows = self._json.get("vnodes")
        return None if rows is None else tuple(VnodeRestore.from_json(v) for v in rows)

    @cached_property
    def splits(self) -> tuple[SplitRestore, ...] | None:
        rows = self._json.get("splits")
        return None if rows is None else tuple(SplitRestore.from_json(s) for s in rows)

    @property
    def report(self) -> dict[str, Any]:
        return {k: v for k, v in self._json.items() if k not in _ROWS}

    def __eq__(self, other: object) -> bool:
        """The same rows (a member left out or null alike) and report."""
        return isinstance(other, CollectProgress) and (
            (self.vnodes, self.splits, self.report) == (other.vnodes, other.splits, other.report)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class CollectRequest:
    """An actor finished the epoch a barrier closes (``recovery_seq``: the graph's
    incarnation it ran in, which tells a late collect of an earlier one)."""

    actor_id: int
    recovery_seq: int
    prev_epoch: int
    curr_epoch: int
    progress: CollectProgress | None = None
    rows: int = 0
    finished: bool = False

    @classmethod
    def from_json(cls, data: Any) -> CollectRequest:
        d = obj(data, "a collect")
        progress = d.get("progress")
        return cls(
            integer(d, "actor_id"),
            integer(d, "recovery_seq"),
            integer(d, "prev_epoch"),
            integer(d, "curr_epoch"),
            None if progress is None else CollectProgress.from_json(progress),
            integer(d, "rows", 0),
            boolean(d, "finished", False),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "actor_id": self.actor_id,
            "recovery_seq": self.recovery_seq,
            "prev_epoch": self.prev_epoch,
            "curr_epoch": self.curr_epoch,
            "progress": None if self.progress is None else self.progress.to_json(),
            "rows": self.rows,
            "finished": self.finished,
        }


class CollectStatus(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # collected before (a retry): nothing changed


@dataclass(frozen=True)
class CollectAnswer:
    status: CollectStatus
    committed_epoch: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CollectAnswer:
        return cls(CollectStatus(d["status"]), int(d["committed_epoch"]))

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "committed_epoch": self.committed_epoch}


@dataclass(frozen=True)
class CollectBatch:
    """Several collects in one request, applied all or nothing."""

    collects: list[CollectRequest]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CollectBatch:
        return cls(
            [CollectRequest.from_json(c) for c in items(get(obj(d), "collects"), "collects")]
        )

    def to_json(self) -> dict[str, Any]:
        return {"collects": [c.to_json() for c in self.collects]}


@dataclass(frozen=True)
class CollectBatchAnswer:
    results: list[CollectAnswer]  # one per collect, in order

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CollectBatchAnswer:
        return cls([CollectAnswer.from_json(r) for r in d["results"]])

    def to_json(self) -> dict[str, Any]:
        return {"results": [r.to_json() for r in self.results]}


@dataclass(frozen=True)
class FailureReport:
    """An actor (None: the whole worker) failed: its graphs recover.

    ``cause_actor_id`` names the actor whose work raised, when the worker knows it: the
    failure counts against that actor's job (its failure policy). ``fatal``: the cause
    cannot go away by trying again (a poison message under ``on_error: fail``), so the
    job fails at once."""

    message: str
    actor_id: int | None = None
    cause_actor_id: int | None = None
    fatal: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FailureReport:
        actor = d.get("actor_id")
        cause = d.get("cause_actor_id")
        return cls(
            str(d["message"]),
            None if actor is None else int(actor),
            None if cause is None else int(cause),
            bool(d.get("fatal", False)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "actor_id": self.actor_id,
            "message": self.message,
            "cause_actor_id": self.cause_actor_id,
            "fatal": self.fatal,
        }
