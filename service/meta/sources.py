"""The shared sources, advanced by the main graph (``docs/architecture.md#sources-kafka``).

A watcher thread keeps every source's partitions and watermarks fresh; barrier
injection reads that cache (never Kafka itself, so a slow broker cannot delay a barrier)
and fixes, for the epoch the barrier opens, the offsets each partition reaches by its
end: up to the high watermark, within the source's rate limit. The rows of epoch ``e``
are then the messages between the offsets at the end of the epoch before and those of
``e``; they commit with the epoch. A partition that appears later starts at its first
offset and is handed to the jobs' actors by a split change in the same barrier, so no
message of it is missed and none needs a backfill.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from backfill_core.executors.source import split_key
from connectors.kafka import KafkaClient, KafkaSpec, KafkaUnavailable
from service.catalog.models import Actor, Job, Source, SourceOffsets
from service.db import Database

log = logging.getLogger(__name__)

Marks = Mapping[int, Mapping[str, tuple[int, int]]]  # source -> split -> (low, high)


class Probe(Protocol):
    def watermarks(self) -> dict[int, tuple[int, int]]: ...
    def close(self) -> None: ...


def kafka_probe(spec: KafkaSpec) -> Probe:
    return KafkaClient(spec)


# how often the watcher looks for sources while there is none (the default barrier
# interval): at most this long before a new source's messages start to flow
NO_SOURCE_WAIT_S = 1.0


class SourceWatcher:
    """Polls the watermarks of every source; barrier injection reads ``marks()``."""

    def __init__(
        self,
        db: Database,
        interval_s: float,
        probe_factory: Callable[[KafkaSpec], Probe] = kafka_probe,
    ) -> None:
        self.db = db
        self.interval_s = interval_s
        self.probe_factory = probe_factory
        self._probes: dict[int, tuple[KafkaSpec, Probe]] = {}
        self._marks: dict[int, dict[str, tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: dict[int, str] = {}

    def marks(self) -> dict[int, dict[str, tuple[int, int]]]:
        with self._lock:
            return {k: dict(v) for k, v in self._marks.items()}

    def refresh(self) -> None:
        """One round over all sources (also called directly by tests)."""
        # one statement outside a transaction: it runs at every barrier interval
        sources = [
            (x.id, KafkaSpec.from_json(x.kafka))
            for x in self.db.all_alone(select(Source.id, Source.kafka), {})
        ]
        live = {sid for sid, _ in sources}
        for sid in list(self._probes):
            if sid not in live:
                self._probes.pop(sid)[1].close()
        fresh: dict[int, dict[str, tuple[int, int]]] = {}
        for sid, spec in sources:
            known = self._probes.get(sid)
            if known is None or known[0] != spec:
                known = (spec, self.probe_factory(spec))
                self._probes[sid] = known
            try:
                fresh[sid] = {str(p): m for p, m in known[1].watermarks().items()}
                self.errors.pop(sid, None)
            except KafkaUnavailable as e:
                # the source stands still until the brokers answer again
                if self.errors.get(sid) != str(e):
                    log.warning("source %s: %s", sid, e)
                self.errors[sid] = str(e)
        with self._lock:
            self._marks = {k: v for k, v in self._marks.items() if k in live}
            self._marks.update(fresh)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:
                log.exception("source watcher round failed")
            self._stop.wait(self.next_wait_s())

    def next_wait_s(self) -> float:
        """The wait before the next round: the barrier interval, or ``NO_SOURCE_WAIT_S``
        when the last round found no source (at 100 ms barriers its look was a tenth of
        an idle control plane's time)."""
        with self._lock:
            none = not self._marks and not self.errors
        return max(self.interval_s, NO_SOURCE_WAIT_S) if none else self.interval_s

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="source-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for _, probe in self._probes.values():
            probe.close()
        self._probes.clear()


# offsets ------------------------------------------------------------------------

_OFFSETS_AT = text(
    """
    SELECT offsets FROM source_offsets
    WHERE source_id = :s AND epoch <= :e ORDER BY epoch DESC LIMIT 1
    """
)


def offsets_at(session: Session, source: Source, epoch: int) -> dict[str, int]:
    """split -> end offset (exclusive) of the source's rows up to epoch ``epoch``."""
    row = session.execute(_OFFSETS_AT, {"s": source.id, "e": epoch}).first()
    out = {k: int(v) for k, v in source.start_offsets.items()}
    if row is not None:
        out.update({k: int(v) for k, v in row[0].items()})
    return out


def epoch_ranges(
    session: Session, source: Source, prev: int, curr: int
) -> dict[str, tuple[int, int]]:
    """split -> [start, end) of the messages that are the rows of epoch ``curr``."""
    before, after = offsets_at(session, source, prev), offsets_at(session, source, curr)
    return {s: (before.get(s, end), end) for s, end in after.items()}


def _budget(rate_limit: int | None, elapsed_ms: int, splits: int) -> int | None:
    """Messages one partition may advance by in an epoch (None: up to its end)."""
    if rate_limit is None:
        return None
    if rate_limit == 0 or splits == 0:
        return 0
    total = max(1, rate_limit * elapsed_ms // 1000)
    return -(-total // splits)


def advance(
    session: Session, prev: int, curr: int, elapsed_ms: int, marks: Marks
) -> dict[str, list[str]]:
    """Fix every source's offsets at the end of epoch ``curr``; returns the split change
    (actor -> all its splits) for partitions that appeared."""
    split_change: dict[str, list[str]] = {}
    if not marks:
        return split_change  # no source has marks (none exists): none advances
    for source in session.execute(select(Source).order_by(Source.id)).scalars():
        seen = marks.get(source.id)
        if not seen:
            continue
        new_splits = sorted(set(seen) - set(source.start_offsets), key=split_key)
        if new_splits:
            # a new partition is read from its first offset, by the main graph alone
            source.start_offsets = {
                **source.start_offsets,
                **{s: int(seen[s][0]) for s in new_splits},
            }
            split_change.update(_assign_new_splits(session, source, new_splits))
        before = offsets_at(session, source, prev)
        budget = _budget(source.rate_limit, elapsed_ms, len(before))
        after = {}
        for split, start in before.items():
            high = seen.get(split, (start, start))[1]
            end = max(start, high if budget is None else min(high, start + budget))
            after[split] = end
        if after != before:
            session.add(SourceOffsets(source_id=source.id, epoch=curr, offsets=after))
    return split_change


def _assign_new_splits(session: Session, source: Source, splits: list[str]) -> dict[str, list[str]]:
    """Each new split goes to the live actor with the fewest, per job reading the source."""
    out: dict[str, list[str]] = {}
    jobs = session.execute(
        select(Job.id).where(
            Job.upstream_source_id == source.id, Job.state.in_(("creating", "created"))
        )
    ).scalars()
    for job_id in list(jobs):
        actors = list(
            session.execute(
                select(Actor)
                .where(Actor.job_id == job_id, Actor.last_epoch.is_(None))
                .order_by(Actor.id)
            ).scalars()
        )
        if not actors:
            continue
        for split in splits:
            target = min(actors, key=lambda a: (len(a.splits), a.id))
            target.splits = sorted([*target.splits, split], key=split_key)
        for a in actors:
            out[str(a.id)] = list(a.splits)
    return out


def rollback(session: Session, committed: int) -> None:
    """Forget where the sources went after the main graph's committed epoch."""
    session.execute(delete(SourceOffsets).where(SourceOffsets.epoch > committed))


def trim(session: Session, keep: int = 1000) -> None:
    """Keep each source's newest ``keep`` offset rows (verify reads recent epochs)."""
    session.execute(
        text(
            """
            DELETE FROM source_offsets o USING (
              SELECT source_id, epoch, row_number() OVER (
                PARTITION BY source_id ORDER BY epoch DESC) AS n
              FROM source_offsets) r
            WHERE o.source_id = r.source_id AND o.epoch = r.epoch AND r.n > :keep
            """
        ),
        {"keep": keep},
    )
