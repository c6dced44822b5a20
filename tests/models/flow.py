"""Flow control as every reference model follows it, written from the seeds once: a
barrier's mutation pauses, resumes or throttles the actors it names (those of one job),
then the next epoch gets a row budget of ``rate_limit * elapsed`` (None: no limit; at
least one row when limited) plus what the last epoch left unread, up to one second's
worth (a token bucket)."""

from __future__ import annotations

from typing import Any


def follow(
    mutation: dict[str, Any] | None,
    actor_id: int,
    paused: bool,
    rate_limit: int | None,
    elapsed_ms: int,
    left: int | None,
) -> tuple[bool, int | None, int | None]:
    """``(paused, rate_limit, budget)`` after a barrier carrying ``mutation``."""
    if mutation:
        # a pause / resume names the actors of the one job it is for
        if actor_id in (mutation.get("pause") or ()):
            paused = True
        if actor_id in (mutation.get("resume") or ()):
            paused = False
        throttle = mutation.get("throttle") or {}
        if str(actor_id) in throttle or actor_id in throttle:
            rate_limit = throttle.get(str(actor_id), throttle.get(actor_id))
    if paused or rate_limit == 0:
        return paused, rate_limit, 0
    if rate_limit is None:
        return paused, rate_limit, None
    refill = max(1, rate_limit * elapsed_ms // 1000)
    burst = max(refill, rate_limit)  # a second's worth, or one epoch's when epochs are longer
    return paused, rate_limit, min(burst, refill + max(0, left or 0))
