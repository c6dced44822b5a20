"""``bench/RESULTS.md`` from ``bench/out/results.json``: the machine, the date, one table
per bench module (value, baseline, ratio, target, pass) with its notes, and links to
the timeline plots. ``python -m bench`` writes it after every run; ``python -m
bench.report`` writes it again from the last results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from contextlib import suppress
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS_JSON = HERE / "out" / "results.json"
RESULTS_MD = HERE / "RESULTS.md"
HISTORY_MD = HERE / "HISTORY.md"  # dated runs and optimisation stories, written by hand
PLOTS = (
    ("throughput.png", "Progress and rows/s of an arrangement and a snapshot backfill over time"),
    ("lag.png", "Log-store lag and upstream barrier latency during those backfills"),
)
PLOTS_FROM = "timeline"  # the module that draws them, into bench/out/

HOW_TO_READ = """\
Every figure is measured next to its **baseline in the same run**, on the same machine
and, where a database is involved, the same Postgres server: the baseline is what the
same work costs without the service (a plain `INSERT INTO ... SELECT`, a plain `COPY`,
a plain PySpark copy job, a plain Kafka consumer, a loopback request, the same workload
without a backfill). The machine is small and shared (other work runs on it), so
absolute values move by 10-20% or more from run to run; the **ratio** (value over
baseline unless the note says otherwise) is the figure to compare. *target* is the
goal for the ratio (or the value where it has a unit); *pass* is `yes` or `NO` against
it, `-` where a figure is only reported."""


def fmt(v: Any) -> str:
    """A cell: ``-`` for nothing, yes/NO for a pass, numbers to 3 significant digits
    (thousands separated)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float | int):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    return str(v)


def machine() -> dict[str, Any]:
    """Facts about this machine, for results.json."""
    facts: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    with suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
        facts["cpu"] = next(
            line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
        )
    with suppress(OSError, StopIteration, ValueError), open("/proc/meminfo") as f:
        kb = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
        facts["memory_gib"] = round(kb / 2**20, 1)
    for dist in ("pyspark", "fastapi", "psycopg2-binary", "pgserver"):
        with suppress(metadata.PackageNotFoundError):
            facts[dist] = metadata.version(dist)
    return facts


def _cell(v: Any) -> str:
    return fmt(v).replace("|", "\\|")


def _machine_table(doc: dict[str, Any]) -> list[str]:
    facts = dict(doc.get("machine") or {})
    run = doc.get("last_run") or {}
    for when in ("before", "after"):
        if run.get(f"load_{when}") is not None:
            facts[f"load average (1, 5, 15 min) {when} the last run"] = ", ".join(
                f"{x:.2f}" for x in run[f"load_{when}"]
            )
    if not facts:
        return ["(not recorded)"]
    return ["| fact | value |", "|---|---|", *(f"| {k} | {_cell(v)} |" for k, v in facts.items())]


def _module(name: str, entry: dict[str, Any]) -> list[str]:
    when = entry.get("finished_at", "?")
    mode = "**--quick**" if entry.get("quick") else "full"
    out = [f"### {name}", "", f"Run {when}, {mode}, {fmt(entry.get('seconds'))} s.", ""]
    if entry.get("error"):
        out += [f"**Failed:** `{entry['error']}`", ""]
    results = entry.get("results") or []
    if results:
        out += [
            "| figure | value | baseline | unit | ratio | target | pass |",
            "|---|--:|--:|---|--:|---|---|",
        ]
        for r in results:
            cells = [r.get(k) for k in ("name", "value", "baseline", "unit", "ratio", "target")]
            out.append("| " + " | ".join(map(_cell, cells)) + f" | {_cell(r.get('passed'))} |")
        out.append("")
        out += [f"* {r['name']}: {r['note']}" for r in results if r.get("note")]
        out.append("")
    return out


def _plots(doc: dict[str, Any], md_dir: Path, out_dir: Path) -> list[str]:
    entry = (doc.get("modules") or {}).get(PLOTS_FROM)
    if not entry or not entry.get("results"):
        return [
            f"No plots: the `{PLOTS_FROM}` bench has not run (`python -m bench --only "
            f"{PLOTS_FROM}`).",
            "",
        ]
    mode = " (a **--quick** run)" if entry.get("quick") else ""
    out = [f"From the `{PLOTS_FROM}` bench of {entry.get('finished_at', '?')}{mode}.", ""]
    for file, title in PLOTS:
        rel = os.path.relpath(out_dir / file, md_dir)
        out.append(f"![{title}]({rel})")
        if not (out_dir / file).exists():
            out.append(f"(missing: `{rel}` was not written)")
        out.append("")
    return out


def render(doc: dict[str, Any], md_dir: Path = HERE, out_dir: Path | None = None) -> str:
    """The Markdown report of a results.json document; links relative to ``md_dir``."""
    out_dir = out_dir if out_dir is not None else md_dir / "out"
    modules: dict[str, dict[str, Any]] = doc.get("modules") or {}
    quick = sorted(m for m, e in modules.items() if e.get("quick"))
    lines = ["# Benchmark results", ""]
    if quick:
        lines += [
            f"> **QUICK RUN** (`--quick`) for {', '.join(quick)}: smaller sizes, a smoke "
            "test of the benches; do not quote these figures.",
            "",
        ]
    lines += [
        f"Written {doc.get('written_at', '?')} by `make bench` (`python -m bench`) from "
        "`bench/out/results.json`; regenerate with `python -m bench.report`. This file "
        "holds the figures of the last run of each bench only; earlier runs and the story "
        f"of each optimisation are in [HISTORY.md]({os.path.relpath(HISTORY_MD, md_dir)}).",
        "",
        "## How to read",
        "",
        HOW_TO_READ,
        "",
        "## Machine",
        "",
        *_machine_table(doc),
        "",
        "## All figures",
        "",
        "| bench | figure | value | baseline | unit | ratio | target | pass |",
        "|---|---|--:|--:|---|--:|---|---|",
    ]
    for name, entry in modules.items():
        if entry.get("error"):
            lines.append(f"| {name} | ERROR | - | - | - | - | - | NO |")
        for r in entry.get("results") or []:
            keys = ("name", "value", "baseline", "unit", "ratio", "target", "passed")
            lines.append(
                f"| {name}{' (quick)' if entry.get('quick') else ''} | "
                + " | ".join(_cell(r.get(k)) for k in keys)
                + " |"
            )
    lines += ["", "## Per bench", ""]
    for name, entry in modules.items():
        lines += _module(name, entry)
    lines += ["## Plots", "", *_plots(doc, md_dir, out_dir)]
    return "\n".join(lines).rstrip() + "\n"


def write(results: Path = RESULTS_JSON, md: Path = RESULTS_MD) -> Path:
    doc = json.loads(results.read_text())
    tmp = md.with_suffix(".tmp")
    tmp.write_text(render(doc, md.parent, results.parent))
    os.replace(tmp, md)
    return md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS_JSON)
    parser.add_argument("--output", type=Path, default=RESULTS_MD)
    args = parser.parse_args(argv)
    print(f"written to {write(args.results, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
