"""/metrics in the Prometheus text format: the meta's own metrics, and per-job gauges
read from the catalog at scrape time (so every control-plane process reports them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import text

from service.api.deps import get_ctx
from service.context import ServiceContext
from service.db import Database
from service.meta.metrics import REGISTRY

router = APIRouter(tags=["metrics"])
Ctx = Annotated[ServiceContext, Depends(get_ctx)]

_JOBS = text(
    """
    SELECT j.id, j.name, j.kind, j.state, j.paused,
           coalesce(p.consumed_rows, 0), coalesce(p.rows_per_s, 0),
           coalesce(p.total_estimate, greatest(coalesce(c.reltuples, 0), 0))
    FROM jobs j
    LEFT JOIN job_progress p ON p.job_id = j.id
    LEFT JOIN relations r ON r.id = j.upstream_relation_id
    LEFT JOIN pg_class c ON c.oid = to_regclass('store.' || quote_ident(r.storage_table))
    ORDER BY j.id
    """
)


class JobCollector:
    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        labels = ["job", "name", "kind"]
        rows = GaugeMetricFamily("backfill_job_rows", "Rows consumed (committed)", labels=labels)
        rate = GaugeMetricFamily(
            "backfill_job_rows_per_second", "Rows consumed per second", labels=labels
        )
        percent = GaugeMetricFamily("backfill_job_percent", "Backfill progress", labels=labels)
        paused = GaugeMetricFamily("backfill_job_paused", "1 while paused", labels=labels)
        state = GaugeMetricFamily(
            "backfill_job_state", "1 for the job's state", labels=[*labels, "state"]
        )
        with self.db.engine.connect() as conn:
            for jid, name, kind, st, is_paused, consumed, rps, total in conn.execute(_JOBS):
                lv = [str(jid), name, kind]
                done = st == "created"
                pct = 100.0 if done else min(99.99, 100 * consumed / max(total, consumed, 1))
                rows.add_metric(lv, consumed)
                rate.add_metric(lv, 0.0 if done else rps)
                percent.add_metric(lv, round(pct, 2))
                paused.add_metric(lv, 1 if is_paused else 0)
                state.add_metric([*lv, st], 1)
        yield from (rows, rate, percent, paused, state)


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
