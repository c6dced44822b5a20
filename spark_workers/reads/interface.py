"""The read-strategy interface: how the worker moves an actor's reads of the open epoch.

The worker's loop is the same for every strategy (``spark_workers.runtime``): poll, let
the strategies reach the barrier (``before_barrier``), hand the barriers to the
executors, collect, let the strategies go on (``after_barrier``), then read
(``read``) until the next barrier. Which strategy reads for an actor is decided in one
place, ``spark_workers.reads.choose``
(``docs/architecture.md#the-workers-read-strategies``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from backfill_core.protocol import Assignment
    from spark_workers.actors import ActorRunner
    from spark_workers.cdc_actor import CdcRunner
    from spark_workers.settings import WorkerSettings
    from spark_workers.source_actor import SourceRunner
    from spark_workers.spark_path import SparkPath

    Runner = ActorRunner | SourceRunner | CdcRunner

# the rows of one read on the driver: small enough that a barrier waits little for it
CHUNK_ROWS = 5_000


class ReadContext(Protocol):
    """What the strategies use of the worker (``spark_workers.runtime.Worker``)."""

    settings: WorkerSettings
    runners: dict[int, Runner]

    @property
    def conn(self) -> Any: ...

    @property
    def spark(self) -> SparkPath | None: ...

    def forget_if_dropped(self, actor_ids: list[int]) -> bool:
        """Forget those of these actors whose job is gone; whether any was."""
        ...

    def recovered_graph(self, incarnations: list[tuple[int, int]]) -> int | None:
        """The first of these (graph, recovery sequence) pairs that recovered since."""
        ...

    def unless_dropped(self, runners: Sequence[Runner]) -> AbstractContextManager[None]:
        """Reads of these actors: failures of a dropped job forgotten, fences raised."""
        ...

    def want_barrier(self) -> None:
        """Ask the control plane for a barrier now (from any thread)."""
        ...


class ReadStrategy(Protocol):
    """One way of moving data: on the driver, a Spark job per epoch, a Spark job spanning
    epochs, Kafka (on the driver or through Spark)."""

    def wants(self, runner: Runner) -> bool:
        """Whether this strategy holds the runner's reads now (they run under way in it,
        across loop rounds): no other strategy reads for it meanwhile."""
        ...

    def read(self, runners: Sequence[Runner], budget: int) -> bool:
        """Read for these runners (chosen for this strategy) up to ``budget`` rows (per
        job, or per actor on the driver) at their open epoch; whether any read ran."""
        ...

    def before_barrier(self, assignments: list[Assignment]) -> None:
        """A poll brought these assignments (and their barriers): end or pause what reads
        at the epoch they close, and account it with the executors."""
        ...

    def after_barrier(self) -> None:
        """The barriers were handled: reads under way go on at the new open epoch."""
        ...

    def supersede(self, graph_id: int) -> None:
        """A recovery overtook the graph's actors here: drop their reads unaccounted."""
        ...

    def stop(self, *, account: bool) -> None:
        """End every read under way (``account``: what they read counts, and an error of
        their own is raised; otherwise dropped, as for a failure or a new registration)."""
        ...


class ReadsOfOneRound:
    """For strategies whose reads end within ``read``: nothing is under way at a barrier."""

    def wants(self, runner: Runner) -> bool:
        return False

    def before_barrier(self, assignments: list[Assignment]) -> None:
        pass

    def after_barrier(self) -> None:
        pass

    def supersede(self, graph_id: int) -> None:
        pass

    def stop(self, *, account: bool) -> None:
        pass
