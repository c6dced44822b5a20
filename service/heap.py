"""The serving process's garbage collector, set for latency.

A full (generation 2) collection walks every tracked object and holds the GIL while it
does: in the control plane that was the whole start-up heap (FastAPI, pydantic,
SQLAlchemy, the app), about once a second under the workers' collects, and every request
in flight waited for it (``bench/HISTORY.md#freezing-imports-out-of-garbage-collection``).
The start-up heap lives as
long as the process, so it is frozen once the server is up (``gc.freeze``: full
collections skip it), and the youngest generation is collected every 10,000 allocations
instead of 700, so fewer short-lived objects (a request's) are promoted and fewer
collections run at all. Cyclic garbage is still collected, only later.
"""

from __future__ import annotations

import gc

# the DML route's pause of the collector while it builds a batch's (acyclic) rows: the
# store's own, which its writes take too
from state_store.versioned import collector_paused

GEN0_THRESHOLD = 10_000


def settle_after_start() -> None:
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


__all__ = ["GEN0_THRESHOLD", "collector_paused", "settle_after_start"]
