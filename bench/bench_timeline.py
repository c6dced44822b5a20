"""Backfills over time: an arrangement and then a snapshot backfill of the same N rows
(1M; 200k with ``--quick``) on a table that a writer keeps updating (20 rows every ~20 ms
through the DML API), through the real control plane (barriers every 200 ms) and one
real worker. Every ~150 ms the bench reads ``GET /v1/jobs/{id}/progress`` (rows
consumed, percent, the API's rows/s, phase, log-store lag); afterwards it reads the
upstream (main graph's) barrier latencies of the same window from the catalog.

Writes ``bench/out/timeline.json`` and two plots: ``bench/out/throughput.png`` (progress
and rows/s over time, next to the ``INSERT INTO ... SELECT`` rate of the same rows
measured in the same run) and ``bench/out/lag.png`` (the snapshot backfill's log-store
lag, and the upstream's barrier latency during each backfill). Its figures: each
backfill's mean rate against that ``INSERT INTO ... SELECT`` rate.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from bench._live import live_worker
from bench._pg import fresh_database
from bench.bench_backfill import PARALLELISM, load_and_insert_select
from bench.bench_coupling import _writer
from service.db import Database

OUT = Path(__file__).resolve().parent / "out"
INTERVAL_MS = 200
POLL_S = 0.15
WINDOW_S = 1.0  # the plotted rate: rows consumed over the last second
KINDS = ("arrangement", "snapshot")
PHASE_COLOURS = {"snapshot": "#dbe9f6", "log_store": "#fde8cf", "finishing": "#e3f2d9"}


def _follow(http: httpx.Client, job_id: int, t0: float) -> list[dict[str, Any]]:
    """Progress samples until the job is created."""
    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + 1800
    while True:
        p = http.get(f"/v1/jobs/{job_id}/progress").json()
        samples.append(
            {
                "t": round(time.perf_counter() - t0, 3),
                "state": p["state"],
                "phase": p["phase"],
                "rows": p["rows"],
                "percent": p["percent"],
                "api_rows_per_s": p["rows_per_s"],
                "log_store_lag_ms": p["log_store_lag_ms"],
                "log_store_lag_epochs": p["log_store_lag_epochs"],
            }
        )
        if p["state"] == "created":
            return samples
        assert p["state"] == "creating", f"job {p['state']}"
        assert time.monotonic() < deadline, "the backfill did not finish"
        time.sleep(POLL_S)


def _windowed_rates(samples: list[dict[str, Any]]) -> None:
    """Adds ``rows_per_s``: rows consumed over the last ``WINDOW_S`` (or since the start)."""
    j = 0
    for s in samples:
        while samples[j + 1]["t"] <= s["t"] - WINDOW_S:
            j += 1
        a = samples[j] if samples[j]["t"] < s["t"] else None
        s["rows_per_s"] = (
            round((s["rows"] - a["rows"]) / (s["t"] - a["t"]), 1) if a is not None else 0.0
        )


def _barriers(db: Database, since: float, until: float, t0_wall: float) -> list[dict[str, Any]]:
    """The main graph's committed barriers injected in [since, until] (wall clock)."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT extract(epoch FROM injected_at), "
                "extract(epoch FROM committed_at - injected_at) FROM barriers "
                "WHERE graph_id = 1 AND state = 'committed' "
                "AND extract(epoch FROM injected_at) BETWEEN :a AND :b ORDER BY injected_at"
            ),
            {"a": since, "b": until},
        ).all()
    return [
        {"t": round(float(at) - t0_wall, 3), "latency_ms": round(float(lat) * 1000, 1)}
        for at, lat in rows
    ]


def _phases(samples: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(phase, from t, to t) runs of the samples."""
    runs: list[tuple[str, float, float]] = []
    for s in samples:
        if runs and runs[-1][0] == s["phase"]:
            runs[-1] = (runs[-1][0], runs[-1][1], s["t"])
        else:
            runs.append((s["phase"], runs[-1][2] if runs else 0.0, s["t"]))
    return runs


def _shade(ax: Any, samples: list[dict[str, Any]]) -> None:
    """The snapshot backfill's phases as coloured bands (each phase in the legend once)."""
    seen: set[str] = set()
    for phase, a, b in _phases(samples):
        if phase in PHASE_COLOURS and b > a:
            label = None if phase in seen else f"snapshot phase: {phase}"
            seen.add(phase)
            ax.axvspan(a, b, color=PHASE_COLOURS[phase], label=label, lw=0)


def _save(plt: Any, fig: Any, path: Path) -> None:
    for ax in fig.axes:
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot(timeline: dict[str, Any], out: Path) -> list[Path]:
    """``throughput.png`` and ``lag.png`` from a timeline (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = timeline["runs"]
    title = f"backfill of {timeline['rows']:,} rows under a writer" + (
        " (--quick)" if timeline["quick"] else ""
    )
    xlabel = "seconds since the job was created"
    paths = [out / "throughput.png", out / "lag.png"]

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6.5), dpi=100)
    for i, (kind, run) in enumerate(runs.items()):
        ts = [s["t"] for s in run["samples"]]
        top.plot(ts, [s["percent"] for s in run["samples"]], color=f"C{i}", label=kind)
        bottom.plot(
            ts,
            [s["rows_per_s"] for s in run["samples"]],
            color=f"C{i}",
            label=f"{kind}: rows/s over the last {WINDOW_S:g} s",
        )
        bottom.plot(
            ts,
            [s["api_rows_per_s"] for s in run["samples"]],
            color=f"C{i}",
            ls=":",
            label=f"{kind}: rows_per_s of the progress API",
        )
    bottom.axhline(
        timeline["insert_select_rows_per_s"],
        color="grey",
        ls="--",
        label="INSERT INTO ... SELECT of the same rows, same run",
    )
    top.set(title=title, ylabel="progress (%)")
    bottom.set(xlabel=xlabel, ylabel="rows/s")
    _save(plt, fig, paths[0])

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6.5), dpi=100)
    snap = runs.get("snapshot")
    if snap is not None:
        _shade(top, snap["samples"])
        top.plot(
            [s["t"] for s in snap["samples"]],
            [s["log_store_lag_ms"] or 0 for s in snap["samples"]],
            color="C3",
            label="log-store lag of the snapshot backfill",
        )
    top.set(title=title, ylabel="log-store lag (ms)")
    for i, (kind, run) in enumerate(runs.items()):
        bottom.plot(
            [b["t"] for b in run["barriers"]],
            [b["latency_ms"] for b in run["barriers"]],
            ".",
            ms=4,
            color=f"C{i}",
            label=f"during the {kind} backfill",
        )
    bottom.axhline(timeline["interval_ms"], color="grey", ls="--", label="barrier interval")
    bottom.set(xlabel=xlabel, ylabel="upstream barrier latency (ms, log scale)", yscale="log")
    _save(plt, fig, paths[1])
    return paths


def _backfill(db: Database, http: httpx.Client, kind: str, n: int) -> dict[str, Any]:
    """One ``kind`` backfill under the writer, followed until created, then dropped."""
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(http, stop, n), daemon=True)
    writer.start()
    try:
        t0, t0_wall = time.perf_counter(), time.time()
        job = {
            "name": f"mv_{kind}",
            "upstream": {"table": "orders"},
            "backfill": kind,
            "parallelism": PARALLELISM,
        }
        r = http.post("/v1/jobs", json=job)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        samples = _follow(http, job_id, t0)
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        writer.join(timeout=30)
    assert http.delete(f"/v1/jobs/{job_id}").status_code in (200, 202, 204)
    _windowed_rates(samples)
    return {
        "seconds": round(elapsed, 2),
        "samples": samples,
        "barriers": _barriers(db, t0_wall, t0_wall + elapsed, t0_wall),
    }


def _p99(xs: list[float]) -> int | None:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]) if xs else None


def run(quick: bool) -> list[dict[str, Any]]:
    n = 200_000 if quick else 1_000_000
    with fresh_database() as (url, db):
        insert_select = load_and_insert_select(db, url, n)
        with live_worker(db, url, INTERVAL_MS, "bench-timeline") as (http, _):
            runs = {kind: _backfill(db, http, kind, n) for kind in KINDS}
    timeline = {
        "quick": quick,
        "rows": n,
        "interval_ms": INTERVAL_MS,
        "parallelism": PARALLELISM,
        "insert_select_s": round(insert_select, 3),
        "insert_select_rows_per_s": round(n / insert_select, 1),
        "runs": runs,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "timeline.json").write_text(json.dumps(timeline, indent=1) + "\n")
    plots = ", ".join(f"bench/out/{p.name}" for p in plot(timeline, OUT))
    base = n / insert_select
    figures = []
    for kind, r in runs.items():
        rate = n / r["seconds"]
        lag = max((s["log_store_lag_ms"] or 0 for s in r["samples"]), default=0)
        lat = [b["latency_ms"] for b in r["barriers"]]
        figures.append(
            {
                "name": f"{kind} backfill's mean rate vs INSERT ... SELECT",
                "value": round(rate),
                "baseline": round(base),
                "ratio": round(rate / base, 3),
                "target": "report",
                "unit": "rows/s",
                "passed": None,
                "note": (
                    f"{n:,} rows in {r['seconds']:.1f} s under a writer (20 updates every "
                    f"~20 ms), {PARALLELISM} actors, one worker, barrier interval "
                    f"{INTERVAL_MS} ms; {len(r['samples'])} progress samples"
                    + (f", peak log-store lag {lag:,} ms" if kind == "snapshot" else "")
                    + f", upstream barrier p99 {_p99(lat)} ms over {len(lat)} barriers; "
                    f"plots: {plots}"
                ),
            }
        )
    return figures
