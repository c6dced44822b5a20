"""Wakes long polls in this process when a barrier is injected or a collect lands.

Other replicas' changes are still seen by the poll's periodic re-check.
"""

from __future__ import annotations

import threading


class BarrierSignal:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

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
