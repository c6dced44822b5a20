"""Soak: 300 barriers through 8 fake actors; memory and catalog rows stay bounded."""

from __future__ import annotations

import gc as pygc

import psutil
import pytest
from sqlalchemy import text

from backfill_core.protocol import CollectProgress, CollectRequest
from service.db import Database
from service.meta import barriers, workers
from service.meta.loop import GC_EVERY_TICKS, MetaLoop
from service.settings import Settings
from tests.kit.meta import committed_epoch, make_job

KEEP = 50  # the trimmed window of committed history, smaller than the service's for speed
WARMUP = 2 * KEEP
BARRIERS = WARMUP + 4 * KEEP  # four windows past the warm-up
# barriers beyond the window: those of the rounds between two trims, and a few in flight
SLACK = GC_EVERY_TICKS + 10
LEASE = 600_000


def _round(db: Database, loop: MetaLoop, worker_id: int) -> int:
    loop.tick()
    result = workers.poll(db, worker_id, LEASE, 0)
    n = 0
    for a in result.assignments:
        for b in a.barriers:
            progress = {
                "vnodes": [
                    {"vnode": lo, "state": "in_progress", "row_count": n} for lo, _ in a.vnodes
                ]
            }
            item = CollectRequest(
                a.actor_id,
                a.recovery_seq,
                b.prev,
                b.curr,
                progress=CollectProgress.from_json(progress),
                rows=1,
            )
            workers.collect(db, worker_id, [item])
            n += 1
    return n


def _catalog_rows(db: Database) -> dict[str, int]:
    with db.engine.connect() as conn:
        return {
            t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
            for t in ("barriers", "barrier_collects", "pending_mutations", "vnode_progress")
        }


@pytest.mark.slow
def test_soak_300_barriers_8_actors(
    db: Database, fresh_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(barriers, "KEEP_COMMITTED", KEEP)
    loop = MetaLoop(Settings(database_url=fresh_db_url, run_barrier_loop=False), db)
    worker = workers.register(db, "soak", 8, LEASE)
    make_job(db, "soak", parallelism=8)
    collected = 0
    for _ in range(WARMUP):  # warm up caches and pools before measuring
        collected += _round(db, loop, worker.id)
    pygc.collect()
    base = psutil.Process().memory_info().rss
    rows_after_warmup = _catalog_rows(db)
    for _ in range(BARRIERS - WARMUP):
        collected += _round(db, loop, worker.id)
    pygc.collect()
    grown = psutil.Process().memory_info().rss
    assert collected == 8 * BARRIERS
    rows = _catalog_rows(db)
    # committed history is trimmed to a bounded window; nothing else accumulates
    bound = KEEP + SLACK
    assert rows["barriers"] <= bound and rows["barrier_collects"] <= 8 * bound
    assert (
        rows["pending_mutations"] == 0 and rows["vnode_progress"] == 8
    )  # one vnode reported per actor
    assert rows["barriers"] <= rows_after_warmup["barriers"] + SLACK
    assert grown - base < 32 * 1024 * 1024, f"memory grew by {(grown - base) / 1e6:.1f} MB"
    with db.engine.connect() as conn:
        latest = conn.execute(
            text("SELECT max(prev_epoch) FROM barriers WHERE state = 'committed'")
        ).scalar()
    assert committed_epoch(db) == latest
