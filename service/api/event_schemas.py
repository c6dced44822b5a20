"""The data of each kind of job event, for the OpenAPI document of the event streams.

An event's ``data`` is a JSON object: the job's id, when it happened, and what its kind
adds (``service.catalog.events`` records them; epochs are decimal strings). The streams'
200 answer is described per event (OpenAPI before 3.2: the ``text/event-stream`` schema is
one event's), one ``oneOf`` branch per kind, its ``data`` a JSON text of the kind's model.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, Field

from service.api.epochs import EpochJson

EVENT_RETRY_MS = 2000  # the stream's `retry:` line, before its first event


class EventData(BaseModel):
    job_id: int
    at: dt.datetime


class JobCreatedEvent(EventData):
    """The job was created; its backfill starts."""

    name: str
    backfill: Literal["arrangement", "chain", "snapshot", "source"]


class PausedEvent(EventData):
    """The job's backfill was paused."""


class ResumedEvent(EventData):
    """The job's backfill was resumed."""


class ThrottledEvent(EventData):
    rate_limit: int | None = Field(description="rows/s per actor; null: none")


class RescaledEvent(EventData):
    parallelism: int


class RecoveredEvent(EventData):
    """The job's graph recovered from its committed epoch."""

    reason: str | None
    recovery_seq: int
    epoch: EpochJson | None = Field(
        default=None, description="the committed epoch it started again from"
    )


class PhaseChangedEvent(EventData):
    """A snapshot backfill read its snapshot and replays the upstream's epochs since."""

    phase: Literal["log_store"]
    epoch: EpochJson


class CreatedEvent(EventData):
    """The backfill finished: the view is complete at ``epoch``."""

    epoch: EpochJson
    merged: bool | None = Field(default=None, description="a snapshot backfill's merge")


class CancelledEvent(EventData):
    """The job was dropped while it was creating."""


class DroppedEvent(EventData):
    """The job was dropped."""


class JobFailedEvent(EventData):
    """The job failed (its failure policy gave up, or a fatal failure): its actors
    stopped; ``POST /v1/jobs/{id}/retry`` starts it again."""

    error: str = Field(description="names the cause, the actor and the committed epoch")
    cause: str = Field(description="the failure's message with its numbers masked")
    actor_id: int
    epoch: EpochJson = Field(description="its graph's committed epoch when it failed")
    attempts: int = Field(description="failures of this cause within the window")


class MessagesSkippedEvent(EventData):
    """Messages of a source's partition that are not rows were skipped (its
    ``on_error: skip``), as of ``epoch``."""

    partition: int
    skipped: int = Field(description="skipped since the partition's last report")
    total: int = Field(description="skipped in this partition by the job so far")
    last_offset: int = Field(description="the last skipped message's offset")
    epoch: EpochJson


class RetriedEvent(EventData):
    """A failed job was started again."""


EVENT_KINDS: dict[str, type[EventData]] = {
    "job_created": JobCreatedEvent,
    "paused": PausedEvent,
    "resumed": ResumedEvent,
    "throttled": ThrottledEvent,
    "rescaled": RescaledEvent,
    "recovered": RecoveredEvent,
    "phase_changed": PhaseChangedEvent,
    "created": CreatedEvent,
    "cancelled": CancelledEvent,
    "dropped": DroppedEvent,
    "job_failed": JobFailedEvent,
    "retried": RetriedEvent,
    "messages_skipped": MessagesSkippedEvent,
}


EVENT_SCHEMA = {"$ref": "#/components/schemas/JobEvent"}


def _event_schema() -> dict[str, Any]:
    """One Server-Sent Event of the streams: ``oneOf`` its kinds."""
    return {
        "oneOf": [
            {
                "type": "object",
                "required": ["event", "data", "id"],
                "properties": {
                    "event": {"const": kind},
                    "id": {"type": "string", "pattern": "^[0-9]+$"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {"$ref": f"#/components/schemas/{model.__name__}"},
                    },
                },
            }
            for kind, model in EVENT_KINDS.items()
        ]
    }


def event_components() -> dict[str, Any]:
    """``JobEvent`` and the models of the events' data, as component schemas."""
    out: dict[str, Any] = {"JobEvent": _event_schema()}
    for model in EVENT_KINDS.values():
        schema = model.model_json_schema(
            ref_template="#/components/schemas/{model}", mode="serialization"
        )
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out
