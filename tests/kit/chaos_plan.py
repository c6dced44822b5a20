"""Chaos scenarios: everything one chaos run does, drawn from a single seed.

The plan is pure data, so a failing seed replays the same workload, jobs, settings and
fault sequence (the interleaving with a live system still depends on timing; the faults
are placed by committed epochs, not by wall-clock time, to keep it close).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

TABLE_KINDS = ("arrangement", "snapshot", "chain")
# Adding Kafka partitions is not among them: librdkafka's mock cluster has no admin API
# (CreatePartitions waits for a controller it never gets). Partition addition is proven
# by the source executor's property test and the meta test, and runs against the real
# broker of docker-compose.
FAULTS = (
    "kill_worker",
    "restart_control_plane",
    "restart_postgres",
    "pause_resume",
    "throttle",
    "rescale",
)
# the extra columns a workload may have, besides ``id bigint`` (key) and ``amount int``
EXTRA_TYPES = ("int", "bigint", "double", "text", "boolean", "date", "jsonb")


@dataclass(frozen=True)
class Workload:
    extra_columns: tuple[tuple[str, str], ...]  # (name, type)
    rows: int  # loaded before the jobs start
    hot_share: float  # share of updates and deletes aimed at the hottest 1% of keys
    mix: tuple[float, float, float]  # weights of insert, update, delete
    batch: int  # ops per DML request
    pause_s: float  # between two DML requests: the write rate
    messages: int  # loaded into the Kafka topic before the jobs start (0: no source)
    # most loaded rows in a few vnodes: actors finish at very different times, so that
    # a rescale deals an actor completed vnodes next to unfinished ones
    skewed: bool = False


@dataclass(frozen=True)
class JobPlan:
    name: str
    kind: str  # arrangement | snapshot | chain | source
    parallelism: int
    rate_limit: int | None
    filter: dict[str, Any] | None

    def body(self, table: str, source: str) -> dict[str, Any]:
        upstream = {"source": source} if self.kind == "source" else {"table": table}
        body: dict[str, Any] = {
            "name": self.name,
            "upstream": upstream,
            "backfill": self.kind,
            "parallelism": self.parallelism,
            "rate_limit": self.rate_limit,
        }
        if self.filter is not None:
            body["filter"] = self.filter
        return body


@dataclass(frozen=True)
class Fault:
    kind: str
    after_commits: int  # main-graph commits to wait for after the previous step
    job: int  # index of the job a job fault is aimed at (or of the worker to kill)
    value: int | None  # rate limit for throttle, parallelism for rescale


@dataclass(frozen=True)
class Scenario:
    seed: int
    workload: Workload
    jobs: tuple[JobPlan, ...]
    barrier_interval_ms: int
    checkpoint_frequency: int
    spark_min_rows: int  # below the backlog of an epoch, reads stay on the worker's driver
    workers: int
    faults: tuple[Fault, ...]

    @property
    def pushdown(self) -> bool:
        """Whether views with a SQL form run inside Postgres (odd seeds) or move their
        rows through the workers (even seeds). Not drawn: the seeds' plans stay as they
        were."""
        return self.seed % 2 == 1

    def describe(self) -> str:
        w = self.workload
        jobs = ", ".join(
            f"{j.kind}(p={j.parallelism}, rate={j.rate_limit}{', filter' if j.filter else ''})"
            for j in self.jobs
        )
        faults = ", ".join(
            f"{f.kind}@+{f.after_commits}" + (f"={f.value}" if f.value is not None else "")
            for f in self.faults
        )
        return (
            f"seed {self.seed}: {w.rows} rows x {2 + len(w.extra_columns)} cols, "
            f"{w.messages} messages, mix {w.mix}, hot {w.hot_share:.2f}, "
            f"{'skewed, ' if w.skewed else ''}batch {w.batch} "
            f"every {w.pause_s:.2f}s; barriers {self.barrier_interval_ms} ms, checkpoint "
            f"every {self.checkpoint_frequency}, spark from {self.spark_min_rows} rows, "
            f"pushdown {'on' if self.pushdown else 'off'}, "
            f"{self.workers} worker(s); jobs: {jobs}; faults: {faults}"
        )


def draw(seed: int, *, kafka: bool = True, restart_postgres: bool = True) -> Scenario:
    """The scenario of ``seed``. Without ``kafka`` no source job is drawn; without
    ``restart_postgres`` (a server the harness does not own) that fault is not drawn."""
    rng = random.Random(seed)
    extra = tuple((f"c{i}", rng.choice(EXTRA_TYPES)) for i in range(rng.choice((0, 1, 2, 4, 8))))
    with_source = kafka and rng.random() < 0.4
    workload = Workload(
        extra_columns=extra,
        rows=rng.choice((2_000, 5_000, 10_000, 20_000)),
        hot_share=rng.choice((0.0, 0.5, 0.9)),
        mix=rng.choice(((1, 1, 1), (4, 2, 1), (1, 4, 1), (1, 1, 3))),
        batch=rng.choice((1, 10, 50)),
        pause_s=rng.choice((0.01, 0.05, 0.2)),
        messages=rng.choice((2_000, 10_000)) if with_source else 0,
        # drawn apart, so that a seed's other draws stay as they were
        skewed=random.Random(f"{seed} skew").random() < 0.3,
    )
    kinds = [rng.choice(TABLE_KINDS) for _ in range(rng.randint(1, 3))]
    if with_source:
        kinds[rng.randrange(len(kinds))] = "source"
    jobs = tuple(
        JobPlan(
            name=f"mv{i}_{kind}",
            kind=kind,
            parallelism=rng.randint(1, 4),
            # slow enough that the faults land while the jobs are still backfilling
            rate_limit=rng.choice((300, 1_000, 3_000)),
            filter=_filter(rng) if kind != "source" and rng.random() < 0.5 else None,
        )
        for i, kind in enumerate(kinds)
    )
    allowed = [f for f in FAULTS if restart_postgres or f != "restart_postgres"]
    faults = []
    for _ in range(rng.randint(2, 5)):
        kind = rng.choice(allowed)
        value = None
        if kind == "throttle":
            value = rng.choice((0, 200, 2_000, 10_000))
        elif kind == "rescale":
            value = rng.randint(1, 4)
        faults.append(Fault(kind, rng.randint(2, 15), rng.randrange(len(jobs)), value))
    # half the throttles lift the rate limit instead: an unthrottled table actor with enough
    # left reads through a Spark job spanning epochs (spark_workers.rounds), which the
    # later faults then hit; drawn apart, so that a seed's other draws stay as they were
    lift = random.Random(f"{seed} lift")
    faults = [
        Fault(f.kind, f.after_commits, f.job, None)
        if f.kind == "throttle" and lift.random() < 0.5
        else f
        for f in faults
    ]
    return Scenario(
        seed=seed,
        workload=workload,
        jobs=jobs,
        barrier_interval_ms=rng.choice((20, 50, 100, 250)),
        checkpoint_frequency=rng.choice((1, 1, 2, 4)),
        spark_min_rows=rng.choice((100_000, 100_000, 3_000)),
        workers=rng.randint(1, 2),
        faults=tuple(faults),
    )


def _filter(rng: random.Random) -> dict[str, Any]:
    choice = rng.randrange(3)
    if choice == 0:
        return {"col": "amount", "op": ">=", "value": rng.randrange(-500, 500)}
    if choice == 1:
        return {
            "col": "amount",
            "op": "in",
            "value": [rng.randrange(-1000, 1000) for _ in range(50)],
        }
    return {
        "or": [
            {"col": "amount", "op": "<", "value": -200},
            {"not": {"col": "amount", "op": "is_null"}},
        ]
    }
