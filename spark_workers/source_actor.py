"""One source-backfill actor on a worker: its executor, Kafka reads, and MV writes (its
backfill reads of the open epoch are the Kafka read strategy's, ``spark_workers.reads.kafka``).

The barrier opening epoch ``e`` names the offsets the shared source advanced over in
``e`` (``source_ranges``); those messages are the upstream rows of ``e`` and are handled
first, then the backfill reads the partitions from their earliest offset during ``e``.
Everything visible in ``e`` is written at ``e``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from backfill_core.changes import Version
from backfill_core.executors.source import (
    OffsetRead,
    SourceBackfill,
    SplitProgress,
    SplitState,
    split_key,
)
from backfill_core.protocol import (
    Assignment,
    BarrierMessage,
    CollectProgress,
    CollectRequest,
    RestoreState,
    SplitRestore,
)
from backfill_core.schema import TableSchema
from backfill_core.view import View
from connectors.kafka import (
    KafkaClient,
    KafkaSpec,
    Message,
    PoisonMessage,
    Skipped,
    decode_messages,
    on_invalid,
)
from spark_workers.actors import ActorFailed, ReadsFrom, fence
from state_store.versioned import VersionedTable

# the job's splits are all finished in committed progress (the seed's check that lets
# an actor leave the backfill stage: no unfinished split can migrate to it any more)
_ALL_FINISHED = """
    SELECT NOT EXISTS (
      SELECT 1 FROM actors a, jsonb_array_elements_text(a.splits) x
      WHERE a.job_id = %(job)s AND a.last_epoch IS NULL
        AND NOT EXISTS (SELECT 1 FROM split_progress p
                        WHERE p.job_id = a.job_id AND p.split = x AND p.state = 'finished'))
"""
_COMMITTED = """
    SELECT split, state, "offset", num_consumed_rows, target_offset, skipped, last_skipped_offset
    FROM split_progress WHERE job_id = %(job)s AND split = ANY(%(splits)s)
"""


def _offset(m: Message) -> int:
    return m.offset


def _progress(split: SplitRestore) -> SplitProgress:
    return SplitProgress(
        SplitState(split.state),
        split.offset,
        split.num_consumed_rows,
        split.target_offset,
        split.skipped,
        split.last_skipped_offset,
    )


class SourceRunner:
    kind = "source"
    reads_from = ReadsFrom.KAFKA
    # its splits go on receiving: reads that run out now end nothing
    reads_run_out = False

    def __init__(self, assignment: Assignment) -> None:
        job = assignment.job
        if job.source is None or job.upstream_schema is None:
            raise ValueError(f"job {job.name!r} reads no source")
        self.actor_id: int = assignment.actor_id
        self.recovery_seq: int = assignment.recovery_seq
        self.graph_id: int = assignment.graph_id
        self.job_id: int = assignment.job_id
        self.spec = KafkaSpec.from_json(job.source.kafka)
        self.on_error = job.source.on_error
        self.schema = TableSchema.from_json(job.upstream_schema)
        self.mv = VersionedTable(job.mv_table, TableSchema.from_json(job.mv_schema))
        self.job_columns: list[str] = list(job.columns)
        self.job_filter: Any = job.filter
        self.view = View.build(self.schema, job.columns, job.filter)
        restore = assignment.restore or RestoreState()
        self.executor = SourceBackfill(
            self.actor_id,
            list(assignment.splits),
            rate_limit=job.rate_limit,
            paused=job.paused,
            restore={s.split: _progress(s) for s in restore.splits},
        )
        self._client: KafkaClient | None = None
        # split -> (lo, hi, messages in [lo, hi)): upstream rows read ahead
        self._buffer: dict[str, tuple[int, int, list[Message]]] = {}

    @property
    def client(self) -> KafkaClient:
        if self._client is None:
            self._client = KafkaClient(self.spec)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def rebind(self, graph_id: int, recovery_seq: int) -> None:
        self.graph_id = graph_id
        self.recovery_seq = recovery_seq

    def has_reads(self) -> bool:
        return bool(self.executor.plan_reads(1))

    def remaining_estimate(self, conn: Any = None) -> int:
        """Messages its backfilling splits have left up to their targets (from the
        executor's state, no Kafka round trip; a split not started counts from offset 0,
        so a topic trimmed by retention is overestimated). ``conn``: unused, as the
        table actors' estimate asks for one."""
        return sum(
            p.target_offset - (-1 if p.offset is None else p.offset)
            for p in self.executor.progress.values()
            if p.state is SplitState.BACKFILLING and p.target_offset is not None
        )

    # epochs -----------------------------------------------------------------

    def _backfill_info(self, source_ranges: Mapping[str, tuple[int, int]]) -> dict[str, int | None]:
        """split -> the last offset to backfill (None: nothing to backfill).

        Unlike the seed, a split that has backfilled up to the end keeps its target
        rather than finishing at once: the shared source may still be behind it, and
        only the upstream rows can tell (SourceCachingUp), so nothing is emitted twice.

        Also unlike the seed, the target is never past the last offset the shared source
        reached in the epoch the first barrier opens (``source_ranges``): the rows go to
        that epoch, and the view must equal the source's messages at every epoch. The
        seed takes the partition's latest offset, so a source lagging behind its topic
        (throttled, or held up by a recovery) had the view ahead of it. From then on the
        upstream rows move the target, never past the source either.
        """
        unfinished = self.executor.unfinished_splits()
        if not unfinished:
            return {}
        marks = self.client.watermarks([int(s) for s, _ in unfinished])
        info: dict[str, int | None] = {}
        for split, offset in unfinished:
            low, high = marks[int(split)]
            latest = max(high - 1, low)
            if split in source_ranges:
                latest = min(latest, int(source_ranges[split][1]) - 1)
            if offset is None and (low == high or latest < low):
                info[split] = None  # no message up to where the source is
            else:
                info[split] = latest
        return info

    def prefetch(self, messages: list[BarrierMessage]) -> None:
        """Read the upstream rows of several barriers in one go (a worker that fell
        behind gets many at once; one read per barrier would keep it behind)."""
        union: dict[str, tuple[int, int]] = {}
        for m in messages:
            for split, (start, end) in (m.source_ranges or {}).items():
                if end > start:
                    lo, hi = union.get(split, (start, end))
                    union[split] = (min(lo, start), max(hi, end))
        self._fill(union)

    def _fill(self, want: dict[str, tuple[int, int]]) -> None:
        missing = {
            s: r
            for s, r in want.items()
            if not (s in self._buffer and self._buffer[s][0] <= r[0] and r[1] <= self._buffer[s][1])
        }
        if not missing:
            return
        got = self.client.read_ranges({int(s): (lo, hi, None) for s, (lo, hi) in missing.items()})
        for split, (lo, hi) in missing.items():
            self._buffer[split] = (lo, hi, got[int(split)])

    def _upstream(self, ranges: Mapping[str, tuple[int, int]], splits: list[str]) -> list[Message]:
        want = {s: (ranges[s][0], ranges[s][1]) for s in splits if s in ranges}
        want = {s: r for s, r in want.items() if r[1] > r[0]}
        self._fill(want)
        out: list[Message] = []
        for split, (start, end) in sorted(want.items(), key=lambda x: split_key(x[0])):
            msgs = self._buffer[split][2]
            lo = bisect_left(msgs, start, key=_offset)
            out += msgs[lo : bisect_left(msgs, end, lo, key=_offset)]
        return out

    def on_barrier(self, conn: Any, message: BarrierMessage) -> CollectRequest:
        barrier = message.barrier
        ranges = message.source_ranges or {}
        ex = self.executor
        if not ex.started:
            ex.on_backfill_info(self._backfill_info(ranges))
        owned = list(ex.progress)
        change = barrier.mutation.splits if barrier.mutation is not None else None
        new_owned = list(change[self.actor_id]) if change and self.actor_id in change else owned
        with conn.cursor() as cur:
            committed: dict[str, SplitProgress] = {}
            added = [x for x in new_owned if x not in ex.progress]
            if added:
                cur.execute(_COMMITTED, {"job": self.job_id, "splits": added})
                for split, *rest in cur.fetchall():
                    committed[split] = _progress(SplitRestore(split, *rest))
            others_finished = False
            if ex.phase.value == "backfilling" and all(
                p.state is SplitState.FINISHED for p in ex.progress.values()
            ):
                cur.execute(_ALL_FINISHED, {"job": self.job_id})
                others_finished = bool(cur.fetchone()[0])
            upstream = self._upstream(ranges, new_owned)
            out = ex.on_barrier(
                barrier,
                [(str(m.partition), m.offset) for m in upstream],
                others_finished=others_finished,
                committed=committed,
                source_ends={s: int(ranges[s][1]) for s in new_owned if s in ranges},
            )
            fence(cur, self.graph_id, self.recovery_seq, self.actor_id)
            # a split change trimmed the dropped splits: their read-ahead goes too (the
            # report of the next barrier no longer lists them, nor does the meta after)
            for split in set(self._buffer) - set(ex.progress):
                del self._buffer[split]
            rows = self.rows_of([upstream[i] for i in out.emit])
            self.mv.write(cur, out.write_epoch, [Version(r) for r in self.view.rows(rows)])
        conn.commit()
        return CollectRequest(
            self.actor_id,
            self.recovery_seq,
            barrier.epoch.prev,
            barrier.epoch.curr,
            CollectProgress.from_json(out.progress),
            out.rows,
            out.finished,
        )

    def rows_of(self, messages: list[Message]) -> list[tuple[Any, ...]]:
        """The rows of messages read for the open epoch; those that are not rows go to
        ``account_skipped``."""
        decoded = decode_messages(self.schema, messages)
        self.account_skipped(decoded.skipped)
        return decoded.rows

    def account_skipped(self, skipped: list[Skipped]) -> None:
        """Messages read for the open epoch that are not rows: the job fails under its
        source's ``on_error: fail``, or they are counted per split (``skip``)."""
        try:
            on_invalid(self.on_error, skipped)
        except PoisonMessage as e:
            raise ActorFailed(self.actor_id, e, fatal=True) from e
        for x in skipped:
            self.executor.on_skipped(str(x.partition), x.count, x.last_offset)

    def with_high_watermarks(self, reads: list[OffsetRead]) -> list[tuple[OffsetRead, int]]:
        """Each read with its split's high watermark now (where a backfill read stops)."""
        marks = self.client.watermarks([int(r.split) for r in reads]) if reads else {}
        return [(r, marks[int(r.split)][1]) for r in reads]
