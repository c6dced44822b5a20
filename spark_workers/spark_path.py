"""The Spark data path: one Spark job per job and epoch reads the snapshot of every
vnode the worker's actors still read and writes the MV rows, parallel over vnodes.

The executors decide the reads and account for them from the per-vnode summaries the
job sends back, exactly as if the rows had passed through the driver: when the view
has a SQL form, groups of vnodes each read under one limit (``plan_reads`` in
``GROUPS``, each ``account``-ed from a ``VnodeSummary``), run inside Postgres; otherwise
one read per vnode sharing the row budget (``plan_reads`` in ``EACH``), the filter and projection run
inside the Spark tasks with the same ``View`` as the driver path and the reference
model.

Source backfill (``_run_source_job``) works the same way over Kafka: the executor's
``plan_reads`` become offset ranges (one per split, up to its target), Spark tasks read
them with confluent-kafka and write the visible rows (``kafka_datasource``), and each
range's summary (``SplitSummary``) goes to ``account``.

Small epochs stay on the driver (``spark_workers.reads.choose``): a Spark job costs a
few hundred ms of scheduling, more than reading a few thousand rows directly.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
import threading
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backfill_core.executors.interface import ReadGrouping, VnodeSummary
from backfill_core.executors.messages import SnapshotBatchRead
from backfill_core.executors.source import OffsetRead, SplitSummary
from backfill_core.protocol import (
    GroupStart,
    KafkaPlan,
    KafkaRange,
    MvWrite,
    ReadGroup,
    TablePlan,
    VnodeRead,
)
from backfill_core.schema import TableSchema, coerce_value, value_to_json
from connectors.kafka import Skipped
from state_store.options import worker_dsn

if TYPE_CHECKING:
    from spark_workers.actors import ActorRunner
    from spark_workers.source_actor import SourceRunner

log = logging.getLogger(__name__)


class SparkPath:
    """Owns the worker's one SparkSession (created on first use)."""

    def __init__(
        self, master: str, dsn: str, *, partitions: int | None = None, pushdown: bool = True
    ) -> None:
        self.master = master
        self.dsn = dsn
        self.partitions = partitions
        self.pushdown = pushdown
        self._spark: Any = None
        self._lock = threading.Lock()
        self.jobs = 0
        self.source_jobs = 0  # of which source backfill reads (Kafka ranges)
        self.pushdown_jobs = 0  # of which table reads run inside Postgres
        self.rounds_jobs = 0  # jobs spanning epochs (``spark_workers.rounds``), besides
        self.round_epochs = 0  # epochs in which such jobs' rounds were written, in all
        self._queue_conn: Any = None  # deletes the pushed-down jobs' work queues
        self.warmed = threading.Event()  # warm_up ran: the session and its workers are up
        self._stopping = threading.Event()  # no warm-up from now on

    def session(self) -> Any:
        with self._lock:
            if self._spark is None:
                self._spark = build_session(self.master, java_options=WORKER_JAVA_OPTIONS)
                from spark_workers.datasource import StoreDataSource
                from spark_workers.import_source import ImportDataSource
                from spark_workers.kafka_datasource import KafkaBackfillDataSource
                from spark_workers.shipped_code import ship_code

                # the executors may have no package of ours (an existing cluster)
                ship_code(self._spark)
                self._spark.dataSource.register(StoreDataSource)
                self._spark.dataSource.register(KafkaBackfillDataSource)
                self._spark.dataSource.register(ImportDataSource)
            return self._spark

    def warm_up(self) -> None:
        """Start the session and its Python workers with an empty read and write."""
        from backfill_core.schema import Column, ColumnType, TableSchema

        spark = self.session()
        if self._stopping.is_set():
            return
        spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
        schema = TableSchema.build([Column("k", ColumnType.BIGINT, False)], ["k"])
        n = max(1, int(spark.sparkContext.defaultParallelism))
        plan = TablePlan(
            MvWrite(self.dsn, "_warm_up", schema, ["k"], None, 0, 0, 0),
            "_warm_up",
            schema,
            0,
            [[] for _ in range(n)],
            [],
            "warm-up",
        ).to_text()
        with tempfile.TemporaryDirectory() as tmp:
            df = spark.read.format("backfill_store").option("plan", plan).load()
            if self._stopping.is_set():
                return
            df.write.format("backfill_store").option("plan", plan).option(
                "summary", os.path.join(tmp, "summary.json")
            ).mode("append").save()
        if self._stopping.is_set():
            return
        # the tasks' modules imported and their connections opened in every worker, and
        # the driver's for work queues
        self._pushed_down(spark, plan, n)
        self.queue_statement("SELECT 1")
        self.warmed.set()

    def cancel_warm_up(self) -> None:
        """End a warm-up under way (the worker stops): its jobs are cancelled, so their
        tasks end as killed rather than with their Python workers when Spark stops."""
        self._stopping.set()
        with self._lock:
            if self._spark is not None and not self.warmed.is_set():
                # Spark logs each cancelled write task as an error with its stack: none is
                # one here, and the process is on its way out (the level is the JVM's)
                self._spark.sparkContext.setLogLevel("OFF")
                self._spark.sparkContext.cancelAllJobs()

    def stop(self) -> None:
        if self._queue_conn is not None:
            self._queue_conn.close()
            self._queue_conn = None
        with self._lock:
            if self._spark is not None:
                self._spark.stop()
                self._spark = None

    def run_epoch(self, runners: Sequence[ActorRunner], max_rows: int) -> int:
        """Read up to ``max_rows`` per job for these table actors; returns the rows read."""
        # one Spark job per backfill job and pair of epochs: actors of one job handle a
        # poll's barriers one after another, so they can be an epoch apart for a moment
        by_job: dict[tuple[int, int, int], list[ActorRunner]] = defaultdict(list)
        for r in runners:
            by_job[(r.job_id, r.executor.snapshot_epoch, r.executor.open_epoch)].append(r)
        return sum(self._run_job(group, max_rows) for group in by_job.values())

    def run_source_epoch(self, runners: Sequence[SourceRunner], max_rows: int) -> int:
        """Read up to ``max_rows`` per job for these source actors; returns the rows read."""
        sources: dict[tuple[int, int, int, int], list[SourceRunner]] = defaultdict(list)
        for r in runners:
            sources[(r.job_id, r.graph_id, r.recovery_seq, r.executor.open_epoch)].append(r)
        return sum(self._run_source_job(group, max_rows) for group in sources.values())

    def _run_source_job(self, runners: list[SourceRunner], max_rows: int) -> int:
        """One Spark job reads the next backfill range of every split these actors (of one
        job, at one open epoch) still backfill, ``max_rows`` in all, and writes the visible
        rows; the executors account for each range from its summary."""
        from spark_workers.kafka_datasource import FORMAT

        share = max(1, max_rows // len(runners))
        reads: list[tuple[SourceRunner, OffsetRead, int]] = []
        for r in runners:
            reads += [
                (r, x, high) for x, high in r.with_high_watermarks(r.executor.plan_reads(share))
            ]
        if not reads:
            return 0
        first = runners[0]
        spark, n_parts = self.active_session(len(reads))
        parts: list[list[KafkaRange]] = [[] for _ in range(n_parts)]
        for i, (_, read, high) in enumerate(reads):
            parts[i * n_parts // len(reads)].append(
                KafkaRange(i, int(read.split), read.start, high, read.limit, read.target)
            )
        plan = KafkaPlan(self.mv_write(first), first.spec.to_json(), first.schema, parts)
        got = {
            row["read"]: row
            for row in spark.read.format(FORMAT).option("plan", plan.to_text()).load().collect()
        }
        self.jobs += 1
        self.source_jobs += 1
        if set(got) != set(range(len(reads))):
            raise RuntimeError(f"the Spark job summarized reads {sorted(got)} of {len(reads)}")
        total = 0
        for i, (r, read, _) in enumerate(reads):
            s = got[i]
            r.executor.account(
                read,
                SplitSummary(
                    s["rows_read"],
                    s["last_offset"],
                    s["visible"],
                    last_visible=s["last_visible"],
                    end=s["end_offset"],
                ),
            )
            if s["skipped"]:
                r.account_skipped(
                    [
                        Skipped(
                            int(read.split),
                            s["skipped"],
                            s["first_skipped"],
                            s["last_skipped"],
                            s["skip_reason"],
                        )
                    ]
                )
            total += s["rows_read"]
        return total

    def mv_write(self, first: ActorRunner | SourceRunner) -> MvWrite:
        """What every Spark job's plan holds: where and how to write the view (the rows'
        job is ``first``'s; one Spark job serves one job's actors at one open epoch)."""
        return MvWrite(
            self.dsn,
            first.mv.name,
            first.mv.schema,
            first.job_columns,
            first.job_filter,
            first.graph_id,
            first.recovery_seq,
            first.executor.open_epoch,
        )

    def active_session(self, reads: int | None = None) -> tuple[Any, int]:
        """The session, active in this thread, and how many Spark partitions ``reads`` get
        (None: how many tasks run at once)."""
        spark = self.session()
        # Spark resolves the writer's data source through the calling thread's active
        # session, which a thread that did not build the session lacks
        spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
        n_parts = self.partitions or max(1, int(spark.sparkContext.defaultParallelism))
        return spark, n_parts if reads is None else min(n_parts, reads)

    def _run_job(self, runners: list[ActorRunner], max_rows: int) -> int:
        share = max(1, max_rows // len(runners))
        first = runners[0]
        read_epoch, _ = job_epochs(runners)  # one plan, one pair of epochs for all
        if self.pushdown and has_sql_form(first.job_filter, first.upstream.schema):
            return self._run_batches(runners, share, read_epoch)
        reads: list[tuple[ActorRunner, SnapshotBatchRead]] = [
            (r, read)
            for r in runners
            for read in r.executor.plan_reads(share, grouping=ReadGrouping.EACH)
        ]
        if not reads:
            return 0
        spark, n_parts = self.active_session(len(reads))
        # contiguous groups of vnodes, as even as the rows allow
        parts: list[list[VnodeRead]] = [[] for _ in range(n_parts)]
        for i, (r, read) in enumerate(reads):
            [(vnode, after)] = read.starts  # one vnode each
            parts[i * n_parts // len(reads)].append(
                VnodeRead(vnode, key_to_json(r, after), read.limit)
            )
        plan = TablePlan(
            self.mv_write(first), first.upstream.name, first.upstream.schema, read_epoch, parts
        )
        got = self._moved_through_spark(spark, plan.to_text())
        self.jobs += 1
        total = 0
        for r, read in reads:
            [(vnode, _)] = read.starts
            count, last = got.get(vnode, (0, None))
            r.executor.account(read, VnodeSummary({vnode: (int(count), key_from_json(r, last))}))
            total += int(count)
        return total

    def _run_batches(self, runners: list[ActorRunner], share: int, read_epoch: int) -> int:
        """The reads run inside Postgres (the view has a SQL form): each actor's vnodes in
        groups, each group read under its share of the rows, whole vnodes one after the
        other as Postgres runs it (``plan_reads``), one statement per group, which
        one Spark task per core take one at a time from the job's work queue
        (``pushdown_tasks``).

        Whole vnodes, where spread reads take a little of every vnode: a statement's rows
        then go to a few places of the MV's key index, each a vnode of its own, where a
        little of every vnode went between the rows earlier jobs had written there,
        splitting pages in half. One task per core, not more: each task has a fixed cost
        in Spark. Several groups per task (``groups_per_actor``), taken in turn: a task
        that is done early takes another group, where groups dealt out in advance left
        its core idle (``bench/HISTORY.md#groups-tasks-and-the-work-queue``).
        """
        spark, cores = self.active_session()
        per_actor = groups_per_actor(len(runners), cores)
        batches: list[tuple[ActorRunner, SnapshotBatchRead]] = [
            (r, b) for r in runners for b in r.executor.plan_reads(share, per_actor)
        ]
        if not batches:
            return 0
        queue = uuid.uuid4().hex
        plan = self.pushdown_plan(batches, queue, read_epoch)
        self.queue_statement("INSERT INTO work_queues (token) VALUES (%s)", queue)
        try:
            got = self._pushed_down(spark, plan.to_text(), min(len(batches), cores))
        finally:
            try:
                self.queue_statement(DELETE_QUEUE, queue)
            except Exception as e:  # a row left behind costs nothing; a later job sweeps it
                log.warning("could not delete work queue %s: %s", queue, e)
        self.jobs += 1
        self.pushdown_jobs += 1
        if set(got) != set(range(len(batches))):
            raise RuntimeError(f"the Spark job ran groups {sorted(got)} of {len(batches)}")
        total = 0
        for i, (r, b) in enumerate(batches):
            summary = VnodeSummary(
                {v: (n, key_from_json(r, last)) for v, (n, last) in got[i].items()}
            )
            r.executor.account(b, summary)
            total += summary.rows
        return total

    def pushdown_plan(
        self,
        batches: Sequence[tuple[ActorRunner, SnapshotBatchRead]],
        queue: str,
        read_epoch: int,
        *,
        rounds: bool = False,
    ) -> TablePlan:
        """The plan of a pushed-down job: ``batches`` as its groups (in order), taken from
        work queue ``queue``, reading the snapshot at ``read_epoch`` (``rounds``: as a job
        spanning epochs, ``spark_workers.rounds``)."""
        first = batches[0][0]
        return TablePlan(
            self.mv_write(first),
            first.upstream.name,
            first.upstream.schema,
            read_epoch,
            groups=[
                ReadGroup(b.limit, [GroupStart(v, key_to_json(r, a)) for v, a in b.starts])
                for r, b in batches
            ],
            queue=queue,
            rounds=rounds,
        )

    @staticmethod
    def _pushed_down(spark: Any, plan: str, n_tasks: int) -> dict[int, dict[int, tuple[int, Any]]]:
        """The plan's groups run inside Postgres, a statement each, taken in turn by
        ``n_tasks`` Spark tasks: per group that ran, per vnode it read rows of, (rows
        read, last key as JSON)."""
        from spark_workers.pushdown_tasks import NO_ROWS, run_group

        tasks = spark.sparkContext.parallelize(range(n_tasks), n_tasks)
        got: dict[int, dict[int, tuple[int, Any]]] = {}
        for g, v, n, last in tasks.flatMap(functools.partial(run_group, plan)).collect():
            summary = got.setdefault(int(g), {})
            if v != NO_ROWS:
                summary[int(v)] = (int(n), json.loads(last))
        return got

    def queue_statement(self, statement: str, *params: Any) -> None:
        """Create, change or delete a job's work queue (autocommit, on a connection kept
        for it)."""
        import psycopg2

        if self._queue_conn is None or self._queue_conn.closed:
            self._queue_conn = psycopg2.connect(worker_dsn(self.dsn))
            self._queue_conn.autocommit = True
        try:
            with self._queue_conn.cursor() as cur:
                cur.execute(statement, list(params))
        except psycopg2.Error:
            self._queue_conn.close()
            self._queue_conn = None
            raise

    @staticmethod
    def _moved_through_spark(spark: Any, plan: str) -> dict[int, tuple[int, Any]]:
        """The rows stream into Spark and back (COPY csv <-> Arrow), the view applied by
        the writer's tasks: per vnode, (rows read, last key as JSON)."""
        fd, summary_path = tempfile.mkstemp(prefix="backfill-summary-", suffix=".json")
        os.close(fd)
        os.unlink(summary_path)
        try:
            df = spark.read.format("backfill_store").option("plan", plan).load()
            df.write.format("backfill_store").option("plan", plan).option(
                "summary", summary_path
            ).mode("append").save()
            with open(summary_path) as f:
                summary = json.load(f)
        finally:
            if os.path.exists(summary_path):
                os.unlink(summary_path)
        return {int(v): (int(n), last) for v, (n, last) in summary["vnodes"].items()}


class ActorEpochsDiffer(RuntimeError):
    """The actors of one Spark job are at different epochs, where its plan reads and
    writes at one pair: the worker reports it as a failure (the graph recovers)."""


def job_epochs(runners: Sequence[ActorRunner]) -> tuple[int, int]:
    """The (read, write) epochs of one Spark job over ``runners`` (actors of one job):
    their snapshot and open epochs, which must be the same for every one of them."""
    epochs = {(r.executor.snapshot_epoch, r.executor.open_epoch) for r in runners}
    if len(epochs) != 1:
        raise ActorEpochsDiffer(f"the actors of one Spark job are at epochs {sorted(epochs)}")
    return epochs.pop()


# a job's work queue goes after it, with any that a driver which died mid-job left
DELETE_QUEUE = "DELETE FROM work_queues WHERE token = %s OR created_at < now() - interval '1 hour'"
GROUPS_PER_TASK = 8  # on average: a job's tail, one task still at work, is short


def round_rows(epoch_rows: int, cores: int) -> int:
    """The rows of a group of a job spanning epochs: those of a group of a job of one
    epoch (``epoch_rows`` in ``GROUPS_PER_TASK`` groups per task); a barrier waits for a
    round under way at most."""
    return max(1, epoch_rows // (GROUPS_PER_TASK * cores))


def groups_per_actor(actors: int, cores: int) -> int:
    """Groups of vnodes each actor's share is read in: at least ``GROUPS_PER_TASK`` per
    task of the job (one per core) in all, so that when one task is done, what is left
    to the others is a group at most (``bench/HISTORY.md#groups-tasks-and-the-work-queue``)."""
    return max(1, -(-GROUPS_PER_TASK * cores // actors))


def key_to_json(r: ActorRunner, key: tuple[Any, ...] | None) -> list[Any] | None:
    """An actor's key (a read's position) as a plan carries it."""
    if key is None:
        return None
    return [value_to_json(t, x) for t, x in zip(r.pk_types, key, strict=True)]


def key_from_json(r: ActorRunner, value: list[Any] | None) -> tuple[Any, ...] | None:
    """An actor's key from a summary's JSON."""
    if value is None:
        return None
    return tuple(coerce_value(t, x) for t, x in zip(r.pk_types, value, strict=True))


def has_sql_form(filter_expr: Any, schema: TableSchema) -> bool:
    """Whether a view with this filter can run inside Postgres (``view_sql``)."""
    from state_store.pushdown import READ
    from state_store.view_sql import filter_sql

    return filter_sql(filter_expr, schema, READ) is not None


# The worker's driver JVM only schedules tasks (the rows stay in Postgres or stream through
# the Python workers): C1-compiled code is fast enough for that, and C2's compiler
# threads took about as much CPU as the JVM's whole share of the work
# (bench/HISTORY.md#the-drivers-jvm-on-c1). The serial collector spares a small heap G1's
# concurrent threads.
WORKER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def build_session(
    master: str, extra_conf: dict[str, str] | None = None, java_options: str = ""
) -> Any:
    """A SparkSession (``java_options``: for the driver JVM, which starts with it)."""
    import sys

    from pyspark.sql import SparkSession

    # Spark's Python workers must run this interpreter (its packages), not python3 on PATH
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for k, v in (extra_conf or {}).items():
        builder = builder.config(k, v)
    spark = (
        builder.master(master)
        .appName("mv-backfill-worker")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.level=warn {java_options}".strip())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark
