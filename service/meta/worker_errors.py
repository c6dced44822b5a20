"""The errors a worker's call gets when the catalog does not know it as alive: one
wording and one code for every route of the worker protocol (docs/protocol.md)."""

from __future__ import annotations

from backfill_core.protocol import ErrorCode
from service.errors import Gone, NotFound


def unknown_worker(worker_id: int) -> NotFound:
    return NotFound(
        f"worker {worker_id} is not registered",
        {"worker_id": worker_id},
        code=ErrorCode.UNKNOWN_WORKER,
    )


def worker_gone(worker_id: int, state: str) -> Gone:
    """A worker declared dead or stopped: it registers again as a new one."""
    return Gone(
        f"worker {worker_id} was declared {state}: register again",
        {"worker_id": worker_id},
        code=ErrorCode.WORKER_GONE,
    )
