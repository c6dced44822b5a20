"""Wakes long polls in this process when a barrier is injected or a collect lands, and
its barrier loop when a graph has something to do that need not wait for the interval.

Other replicas' changes are still seen by the poll's periodic re-check, and what they
were asked for waits for the leader's next round at the interval.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class BarrierSignal:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._requests = threading.Condition()
        self._requested: set[str] = set()  # kinds of graph wanting a round now

    @property
    def generation(self) -> int:
        return self._generation

    def notify(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout_s: float) -> int:
        """Wait until something happened after generation ``seen`` (or the timeout)."""
        with self._cond:
            if self._generation == seen:
                self._cond.wait(timeout_s)
            return self._generation

    def request_barrier(self, kinds: Iterable[str] = ("main", "creating")) -> None:
        """The graphs of ``kinds`` have something to do that need not wait for the
        interval (a job created or steered, actors that read everything they had to)."""
        with self._requests:
            self._requested.update(kinds)
            self._requests.notify_all()

    def wait_for_barrier_request(self, timeout_s: float) -> frozenset[str]:
        """The kinds of graph a round was requested for since the last call, waiting up
        to ``timeout_s`` for a request (empty: none came)."""
        with self._requests:
            if not self._requested:
                self._requests.wait(timeout_s)
            kinds = frozenset(self._requested)
            self._requested.clear()
            return kinds
