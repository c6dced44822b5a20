"""The worker protocol's error codes, shared by the control plane and the workers.

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
