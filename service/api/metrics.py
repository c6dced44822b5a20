"""/metrics in the Prometheus text format: the meta's own metrics, and per-job series
read from the catalog at scrape time (so every control-plane process reports them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import text

from service.api.deps import get_ctx
from service.catalog.queries import WAITING_FOR_WORKER_SQL
from service.context import ServiceContext
from service.db import Database
from service.meta.metrics import REGISTRY
from service.usecases.progress import completion

router = APIRouter(tags=["metrics"])
Ctx = Annotated[ServiceContext, Depends(get_ctx)]

_JOBS = text(
    f"""
    SELECT j.id, j.name, j.kind, j.state, j.paused,
           coalesce(p.consumed_rows, 0), coalesce(p.rows_per_s, 0),
           coalesce(p.total_estimate, greatest(coalesce(c.reltuples, 0), 0)),
           (SELECT count(*) FROM actors a WHERE a.job_id = j.id AND a.last_epoch IS NULL),
           {WAITING_FOR_WORKER_SQL},
           (SELECT coalesce(sum(x.skipped), 0) FROM split_progress x WHERE x.job_id = j.id),
           (SELECT t.slot_lag_bytes FROM cdc_tables t WHERE t.job_id = j.id)
    FROM jobs j
    LEFT JOIN job_progress p ON p.job_id = j.id
    LEFT JOIN relations r ON r.id = j.upstream_relation_id
    LEFT JOIN pg_class c ON c.oid = to_regclass('store.' || quote_ident(r.storage_table))
    ORDER BY j.id
    """
)
_WORKERS = text("SELECT count(*) FILTER (WHERE state = 'alive'), count(*) FROM workers")


class JobCollector:
    """Per-job series read from the catalog at scrape time. Rates are the scraper's to
    compute (``rate(backfill_job_rows_total[1m])``); progress is a 0..1 ratio."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        labels = ["job_id", "name", "kind"]
        rows = CounterMetricFamily(
            "backfill_job_rows", "Rows consumed as of the committed epoch", labels=labels
        )
        progress = GaugeMetricFamily(
            "backfill_job_progress_ratio", "Backfill progress, 0 to 1", labels=labels
        )
        eta = GaugeMetricFamily(
            "backfill_job_eta_seconds",
            "Seconds left at the current rate (creating jobs that move)",
            labels=labels,
        )
        paused = GaugeMetricFamily("backfill_job_paused", "1 while paused", labels=labels)
        actors = GaugeMetricFamily("backfill_job_actors", "Live actors", labels=labels)
        waiting = GaugeMetricFamily(
            "backfill_job_waiting_for_worker",
            "1 while the creating job has an actor no live worker runs",
            labels=labels,
        )
        state = GaugeMetricFamily(
            "backfill_job_state", "1 for the job's state", labels=[*labels, "state"]
        )
        skipped = CounterMetricFamily(
            "backfill_job_messages_skipped",
            "Source messages that are not rows, skipped (on_error: skip), as committed",
            labels=labels,
        )
        slot_lag = GaugeMetricFamily(
            "backfill_cdc_slot_lag_bytes",
            "WAL the upstream keeps for a CDC table's slot (its current LSN - confirmed)",
            labels=labels,
        )
        workers = GaugeMetricFamily(
            "backfill_workers", "Registered workers by liveness", labels=["state"]
        )
        with self.db.engine.connect() as conn:
            for row in conn.execute(_JOBS):
                jid, name, kind, st, is_paused, consumed, rps, total, live, no_worker, bad, lag = (
                    row
                )
                lv = [str(jid), name, kind]
                percent, left = completion(consumed, max(total, consumed), rps, st == "created")
                rows.add_metric(lv, consumed)
                progress.add_metric(lv, round(percent / 100, 4))
                if st == "creating" and left is not None:
                    eta.add_metric(lv, left)
                paused.add_metric(lv, 1 if is_paused else 0)
                actors.add_metric(lv, live)
                waiting.add_metric(lv, 1 if no_worker else 0)
                state.add_metric([*lv, st], 1)
                if kind == "source":
                    skipped.add_metric(lv, bad)
                if lag is not None:
                    slot_lag.add_metric(lv, lag)
            alive, registered = conn.execute(_WORKERS).one()
        workers.add_metric(["alive"], alive)
        workers.add_metric(["not_alive"], registered - alive)
        yield from (rows, progress, eta, paused, actors, waiting, state, skipped, slot_lag, workers)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
    operation_id="getMetrics",
)
def metrics(ctx: Ctx) -> Response:
    jobs = CollectorRegistry(auto_describe=False)
    jobs.register(JobCollector(ctx.db))  # type: ignore[arg-type]
    body = generate_latest(REGISTRY) + generate_latest(jobs)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
