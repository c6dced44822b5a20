"""The wall clock, injected so that tests and the core never read it themselves."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def system_clock() -> int:
    """Unix time in milliseconds."""
    return time.time_ns() // 1_000_000
