"""Leader duties that may take long, each on a thread of its own (garbage collection,
building MVs' epoch indexes): the barrier loop only wakes them. Run inside its ticks,
the first garbage collection of a freshly loaded large table held every barrier back for
seconds (``bench/HISTORY.md#garbage-collection-off-the-barrier-loop``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Chore:
    """Runs ``run_once`` when woken (and every ``every_s`` if given) while ``is_leader``
    is set, at most once per ``min_gap_s``; a failed run is logged and tried again at
    the next wake."""

    def __init__(
        self,
        name: str,
        run_once: Callable[[], object],
        is_leader: threading.Event,
        *,
        every_s: float | None = None,
        min_gap_s: float = 0.0,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.run_once = run_once
        self.is_leader = is_leader
        self.every_s = every_s
        self.min_gap_s = min_gap_s  # a loop ticking every 20 ms wakes it as often
        self.on_stop = on_stop  # e.g. cancels a long statement under way
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.every_s)
            self._wake.clear()
            if self._stop.is_set() or not self.is_leader.is_set():
                continue
            try:
                self.run_once()
            except Exception:
                log.exception("%s failed; tried again later", self.name)
            self._stop.wait(self.min_gap_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self.on_stop is not None:
            self.on_stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
