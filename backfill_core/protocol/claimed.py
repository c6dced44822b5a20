"""What exports and imports share on the wire: work a worker claims from the control
plane and runs as a Spark job. A claimed task names the relation and its storage; a
report says where the work stands (``running``, then how it ended); every message
carries one of the states below."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backfill_core.protocol.decode import MalformedMessage, get, integer, obj, opt_integer, text


class TaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)


def decode_state(d: Mapping[str, Any], kind: str) -> TaskState:
    """The message's ``state``; ``kind`` (``export``, ``import``) names the work in the
    error."""
    value = text(d, "state")
    try:
        return TaskState(value)
    except ValueError:
        raise MalformedMessage(f"state {value!r} is not an {kind}'s state") from None


def opt_text(d: Mapping[str, Any], key: str) -> str | None:
    value = d.get(key)
    if value is not None and not isinstance(value, str):
        raise MalformedMessage(f"{key} is not a string")
    return value


@dataclass(frozen=True)
class ClaimedTask:
    """The members every claimed task starts with: its id, the relation's name, its
    storage table and its schema (``table_schema`` in its JSON form,
    ``backfill_core.schema.TableSchema.from_json``)."""

    id: int
    relation: str
    storage_table: str
    table_schema: dict[str, Any]

    @staticmethod
    def decode_claimed(d: Mapping[str, Any]) -> tuple[int, str, str, dict[str, Any]]:
        return (
            integer(d, "id"),
            text(d, "relation"),
            text(d, "storage_table"),
            dict(obj(get(d, "table_schema"), "table_schema")),
        )

    def claimed_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "relation": self.relation,
            "storage_table": self.storage_table,
            "table_schema": self.table_schema,
        }


@dataclass(frozen=True)
class TaskReport:
    """The members every report starts with: the state, the rows once succeeded, the
    error once failed."""

    state: TaskState
    rows: int | None = None
    error: str | None = None

    @staticmethod
    def decode_report(d: Mapping[str, Any], kind: str) -> tuple[TaskState, int | None, str | None]:
        state = decode_state(d, kind)
        if state is TaskState.QUEUED:
            raise MalformedMessage(f"a worker cannot put an {kind} back in the queue")
        return state, opt_integer(d, "rows"), opt_text(d, "error")

    def report_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "rows": self.rows, "error": self.error}
