"""Prometheus metrics of the meta role (one registry per process), named by Prometheus's
conventions: base units (`_seconds`), `_total` counters, ids as `*_id` labels (never
`job` or `instance`, which Prometheus owns), and the process and Python collectors
(docs/operations.md#what-to-alert-on)."""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

REGISTRY = CollectorRegistry(auto_describe=True)
for _standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):  # process_*, python_*
    REGISTRY.register(_standard)

BARRIER_LATENCY = Histogram(
    "backfill_barrier_latency_seconds",
    "Barrier inject-to-commit latency",
    ["graph_id"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
INFLIGHT_BARRIERS = Gauge(
    "backfill_barriers_inflight",
    "Injected barriers not yet committed",
    ["graph_id"],
    registry=REGISTRY,
)
COMMITTED_EPOCH = Gauge(
    "backfill_committed_epoch", "Committed epoch of a graph", ["graph_id"], registry=REGISTRY
)
RECOVERIES = Counter(
    "backfill_recoveries_total", "Graph recoveries", ["graph_id", "reason"], registry=REGISTRY
)
JOB_FAILURES = Counter(
    "backfill_job_failures_total",
    "Failures of a job's actors: outcome backoff (its graph recovers later) or failed",
    ["job_id", "outcome"],
    registry=REGISTRY,
)
BARRIERS_INJECTED = Counter(
    "backfill_barriers_injected_total", "Barriers injected", ["graph_id", "kind"], registry=REGISTRY
)
IS_LEADER = Gauge("backfill_is_leader", "1 while this process injects barriers", registry=REGISTRY)
HTTP_REQUESTS = Counter(
    "backfill_http_requests_total",
    "HTTP requests by route template, method and status",
    ["route", "method", "status"],
    registry=REGISTRY,
)
HTTP_LATENCY = Histogram(
    "backfill_http_request_seconds",
    "HTTP request handling time (to the response's start) by route template",
    ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
    registry=REGISTRY,
)
