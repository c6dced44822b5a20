"""``bench/RESULTS.md`` from ``bench/out/results.json``: the machine, the date, one table
per bench module (value, baseline, ratio, target, pass) with its notes, the mutation
score, and links to the timeline plots. ``python -m bench`` writes it after every run;
``python -m bench.report`` writes it again from the last results.

The mutation score is not in results.json: ``make mutation`` writes its set's part of the
section in RESULTS.md itself (``record_mutation``) and every rewrite keeps that section.
A bench that results.json does not hold (a ``--only`` run on a machine without the
earlier results.json, which is not committed) keeps its figures from the RESULTS.md
being replaced (``kept_modules``).
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
MUTATION_HEADING = "## Mutation score"
MUTATION_INTRO = """\
Written by `make mutation` (`python -m tests.kit.mutation`; not part of `make test`), one
part per set; see [the mutation score](../docs/architecture.md#mutation-score) for what
each set mutates and which tests run against it."""
NO_MUTATION_RUN = "No `make mutation` run recorded."

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


class KeptModule:
    """A bench's figures as an earlier RESULTS.md showed them: its rows of the table of
    all figures, its section under *Per bench*, and for the bench that draws them, the
    section of plots."""

    def __init__(self, rows: list[str], section: list[str]) -> None:
        self.rows = rows
        self.section = section
        self.plots: list[str] = []


def kept_modules(md_text: str) -> dict[str, KeptModule]:
    """The benches of a RESULTS.md, by name, as text."""
    per_bench = _section(md_text, "## Per bench")
    if per_bench is None:
        return {}
    kept: dict[str, KeptModule] = {}
    for chunk in ("\n" + md_text[per_bench[0] : per_bench[1]]).split("\n### ")[1:]:
        name, _, body = chunk.partition("\n")
        name = name.strip()
        kept[name] = KeptModule([], [f"### {name}", "", *body.strip("\n").split("\n"), ""])
    figures = _section(md_text, "## All figures")
    if figures is not None:
        for row in md_text[figures[0] : figures[1]].splitlines():
            bench = row.split("|")[1].strip().removesuffix(" (quick)") if "|" in row else ""
            if bench in kept:
                kept[bench].rows.append(row)
    plots = _section(md_text, "## Plots")
    if plots is not None and PLOTS_FROM in kept:
        kept[PLOTS_FROM].plots = md_text[plots[0] : plots[1]].strip("\n").split("\n") + [""]
    return kept


def render(
    doc: dict[str, Any],
    md_dir: Path = HERE,
    out_dir: Path | None = None,
    mutation: str | None = None,
    kept: dict[str, KeptModule] | None = None,
) -> str:
    """The Markdown report of a results.json document; links relative to ``md_dir``;
    ``mutation``: the mutation parts kept from the file it replaces; ``kept``: benches
    of that file which the document does not hold, shown as they were."""
    out_dir = out_dir if out_dir is not None else md_dir / "out"
    modules: dict[str, dict[str, Any]] = doc.get("modules") or {}
    kept = {n: k for n, k in (kept or {}).items() if n not in modules}
    names = sorted({*modules, *kept})
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
    for name in names:
        if name in kept:
            lines += kept[name].rows
            continue
        entry = modules[name]
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
    for name in names:
        lines += kept[name].section if name in kept else _module(name, modules[name])
    lines += [MUTATION_HEADING, "", MUTATION_INTRO, "", mutation or NO_MUTATION_RUN, ""]
    plots = kept[PLOTS_FROM].plots if PLOTS_FROM in kept else _plots(doc, md_dir, out_dir)
    lines += ["## Plots", "", *plots]
    return "\n".join(lines).rstrip() + "\n"


def _section(text: str, heading: str, level: str = "## ") -> tuple[int, int] | None:
    """The span of a section's body: after its heading line up to the next heading of
    the same level (or the end)."""
    lines = text.splitlines(keepends=True)
    starts = [sum(map(len, lines[:i])) for i in range(len(lines) + 1)]
    try:
        first = next(i for i, ln in enumerate(lines) if ln.rstrip("\n") == heading)
    except StopIteration:
        return None
    end = next((i for i in range(first + 1, len(lines)) if lines[i].startswith(level)), len(lines))
    return starts[first + 1], starts[end]


def kept_mutation(md_text: str) -> str | None:
    """The mutation parts of a RESULTS.md (the section's body after its intro)."""
    span = _section(md_text, MUTATION_HEADING)
    if span is None:
        return None
    body = md_text[span[0] : span[1]].strip()
    body = body.removeprefix(MUTATION_INTRO).strip()
    return None if body in ("", NO_MUTATION_RUN) else body


def _replace(md: Path, text: str) -> None:
    tmp = md.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, md)


def write(results: Path = RESULTS_JSON, md: Path = RESULTS_MD) -> Path:
    doc = json.loads(results.read_text())
    old = md.read_text() if md.exists() else ""
    text = render(
        doc, md.parent, results.parent, mutation=kept_mutation(old), kept=kept_modules(old)
    )
    _replace(md, text)
    return md


def record_mutation(set_name: str, part: str, md: Path = RESULTS_MD) -> Path:
    """Put one mutation set's report (``### Set `name```, then its table and survivors)
    into RESULTS.md, replacing that set's earlier part and keeping the others."""
    heading = f"### Set `{set_name}`"
    text = md.read_text()
    parts: dict[str, str] = {}
    for chunk in ("\n" + (kept_mutation(text) or "")).split("\n### ")[1:]:
        title, _, body = chunk.partition("\n")
        parts["### " + title.strip()] = body.strip()
    parts[heading] = part.strip()
    body = "\n\n".join(f"{h}\n\n{b}" for h, b in sorted(parts.items()))
    section = f"\n{MUTATION_INTRO}\n\n{body}\n\n"
    span = _section(text, MUTATION_HEADING)
    if span is None:  # a RESULTS.md from before the section: it goes before the plots
        plots = _section(text, "## Plots")
        at = text.index("## Plots") if plots else len(text)
        text = f"{text[:at]}{MUTATION_HEADING}\n{section}{text[at:]}"
    else:
        text = text[: span[0]] + section + text[span[1] :]
    _replace(md, text)
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
