"""/metrics follows Prometheus's conventions (issue 34), checked as ``promtool check
metrics`` would: counters end in ``_total``, no gauge does, base units (``_seconds``,
``_bytes``, ``_ratio``) and no rates or percents exported as gauges, no label Prometheus
owns (``job``, ``instance``), help on every family, the process and Python collectors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.db import Database
from tests.kit.meta import make_job

NAME = re.compile(r"^[a-z_:][a-z0-9_:]*$")
OWNED_LABELS = {"job", "instance", "__name__"}
UNITLESS_OR_BASE = re.compile(r"_(seconds|bytes|ratio|total|info)$")
NOT_BASE_UNITS = ("_ms", "_milliseconds", "percent", "per_second", "_minutes")


def lint(text: str) -> list[str]:
    problems: list[str] = []
    for family in text_string_to_metric_families(text):
        name, kind = family.name, family.type
        if not NAME.match(name):
            problems.append(f"{name}: not a metric name")
        if not family.documentation.strip():
            problems.append(f"{name}: no help")
        if any(bad in name for bad in NOT_BASE_UNITS):
            problems.append(f"{name}: not in base units (or a rate / percent as a gauge)")
        if kind in ("histogram", "summary") and not UNITLESS_OR_BASE.search(name):
            problems.append(f"{name}: a {kind} without its unit")
        for sample in family.samples:
            if kind == "counter" and not sample.name.endswith(("_total", "_created")):
                problems.append(f"{sample.name}: a counter not ending in _total")
            if kind == "gauge" and sample.name.endswith("_total"):
                problems.append(f"{sample.name}: a gauge ending in _total")
            owned = OWNED_LABELS & set(sample.labels)
            if owned:
                problems.append(f"{sample.name}: label {sorted(owned)} belongs to Prometheus")
    return sorted(set(problems))


def test_the_metrics_follow_the_conventions(client: TestClient, db: Database) -> None:
    job = make_job(db, "lint", 2)
    assert client.post(f"/v1/jobs/{job}/pause").status_code == 200
    assert client.get("/v1/jobs/999999").status_code == 404  # an HTTP series of each kind
    text = client.get("/metrics").text
    assert lint(text) == []
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"process_cpu_seconds", "python_info", "python_gc_objects_collected"} <= names
    labels = f'job_id="{job}",kind="arrangement",name="lint"'
    for series in (
        f"backfill_job_rows_total{{{labels}}} 0.0",
        f"backfill_job_progress_ratio{{{labels}}} 0.0",
        f"backfill_job_actors{{{labels}}} 2.0",
        f"backfill_job_paused{{{labels}}} 1.0",
        'backfill_workers{state="alive"} 0.0',
    ):
        assert series in text, series


def test_the_linter_finds_what_it_looks_for() -> None:
    bad = "\n".join(
        [
            "# HELP backfill_job_percent p",
            "# TYPE backfill_job_percent gauge",
            'backfill_job_percent{job="1"} 5.0',
            "# HELP backfill_things_total t",
            "# TYPE backfill_things_total gauge",
            "backfill_things_total 1.0",
            "# HELP backfill_wait w",
            "# TYPE backfill_wait histogram",
            'backfill_wait_bucket{le="+Inf"} 1.0',
            "backfill_wait_sum 1.0",
            "backfill_wait_count 1.0",
            "",
        ]
    )
    assert lint(bad) == [
        "backfill_job_percent: label ['job'] belongs to Prometheus",
        "backfill_job_percent: not in base units (or a rate / percent as a gauge)",
        "backfill_things_total: a gauge ending in _total",
        "backfill_wait: a histogram without its unit",
    ]


def test_the_grafana_dashboard_queries_only_series_the_service_exports(
    client: TestClient, db: Database
) -> None:
    """deploy/grafana/dashboards/backfill.json (provisioned by docker-compose.yml): every
    series a panel's query names is one /metrics exports, and every panel reads the
    provisioned Prometheus."""
    make_job(db, "dash", 1)
    assert client.get("/v1/jobs/999999").status_code == 404
    exported: set[str] = set()
    for family in text_string_to_metric_families(client.get("/metrics").text):
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count"),
        }.get(family.type, ("",))
        exported |= {family.name + s for s in suffixes}
    root = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
    source = yaml.safe_load((root / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (uid,) = {d["uid"] for d in source["datasources"]}
    dashboard = json.loads((root / "dashboards" / "backfill.json").read_text())
    assert dashboard["panels"], "an empty dashboard"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\b((?:backfill|process|python)_[a-z0-9_]+)", target["expr"]))
            assert used and used <= exported, (panel["title"], sorted(used - exported))
