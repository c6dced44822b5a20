"""Wakes long polls in this process when a barrier is injected or a collect lands, and
its barrier loop when a mutation was queued.

Other replicas' changes are still seen by the poll's periodic re-check, and their
mutations ride the leader's next barrier at the interval.
"""

from __future__ import annotations

import threading


class BarrierSignal:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._barrier_requested = threading.Event()

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

    def request_barrier(self) -> None:
        """A job was created or steered: its mutation need not wait for the interval."""
        self._barrier_requested.set()

    def wait_for_barrier_request(self, timeout_s: float) -> bool:
        """Wait until a barrier is requested (True) or the timeout passes (False)."""
        requested = self._barrier_requested.wait(timeout_s)
        self._barrier_requested.clear()
        return requested
