"""A worker asks the control plane for barriers once per step: assignments it polled
between two Spark jobs (which had barriers) are the next step's, not asked again."""

from __future__ import annotations

from typing import Any

from service.settings import Settings
from spark_workers.runtime import Worker


class ScriptedControlPlane:
    """The other side of the barrier poll: no assignments, and a count of the polls."""

    def __init__(self) -> None:
        self.polls: list[bool] = []  # barrier_wanted of each poll

    def poll(self, timeout_ms: int = 5000, *, barrier_wanted: bool = False) -> dict[str, Any]:
        self.polls.append(barrier_wanted)
        return {"assignments": []}

    def collect_many(self, collects: list[dict[str, Any]]) -> None:
        raise AssertionError("nothing to collect")


def _worker() -> tuple[Worker, ScriptedControlPlane]:
    worker = Worker("http://control-plane.invalid", "w", settings=Settings())
    fake = ScriptedControlPlane()
    worker.client = fake  # type: ignore[assignment]
    return worker, fake


def test_a_step_takes_the_assignments_polled_before_it() -> None:
    worker, fake = _worker()
    worker.polled = []
    worker._step()
    assert fake.polls == []
    assert worker.polled is None  # taken once
    worker._step()
    assert fake.polls == [False]


def test_a_wanted_barrier_is_asked_for_even_with_assignments_at_hand() -> None:
    worker, fake = _worker()
    worker.polled = []
    worker.barrier_wanted = True
    worker._step()
    assert fake.polls == [True]
    assert worker.polled is None
