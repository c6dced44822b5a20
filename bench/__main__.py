"""``make bench``: run every benchmark in this folder and print figures next to baselines.

A bench module is ``bench/bench_<name>.py`` with ``run(quick: bool) -> list[dict]``; each
dict has ``name, value, baseline, ratio, target, unit, passed`` (bool or None) and
``note``. The figures also go to ``bench/out/results.json`` (merged per module, so
``--only`` keeps the other modules' last figures), and ``bench/RESULTS.md`` is written
from it (``bench/report.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench import report
from bench.report import fmt
from tests.kit.auth import use_test_tokens

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "results.json"
PREFIX = "bench_"
KEYS = ("name", "value", "baseline", "ratio", "target", "unit", "passed", "note")


def discover() -> list[str]:
    """Names of the bench modules (``bench_store`` -> ``store``), sorted."""
    return sorted(
        m.name[len(PREFIX) :]
        for m in pkgutil.iter_modules([str(HERE)])
        if m.name.startswith(PREFIX) and not m.ispkg
    )


def run_module(name: str, quick: bool) -> dict[str, Any]:
    """The module's entry, run in this process."""
    started = time.perf_counter()
    entry: dict[str, Any] = {"quick": quick, "results": [], "error": None}
    try:
        module = importlib.import_module(f"bench.{PREFIX}{name}")
        results = module.run(quick)
        for r in results:
            missing = [k for k in KEYS if k not in r]
            if missing:
                raise ValueError(f"figure {r.get('name')!r} lacks {', '.join(missing)}")
        entry["results"] = [{k: r[k] for k in KEYS} for r in results]
    except Exception as e:  # one broken benchmark must not hide the others
        traceback.print_exc()
        entry["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    entry["seconds"] = round(time.perf_counter() - started, 1)
    entry["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return entry


def run_isolated(name: str, quick: bool) -> dict[str, Any]:
    """The module's entry, run in a child process: each bench gets its own Spark JVM (its
    classpath, e.g. the JDBC jar, is fixed when the first session starts), threads and
    memory, and a crash costs only its own figures."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "entry.json"
        cmd = [sys.executable, "-m", "bench", "--only", name, "--child-result", str(result)]
        code = subprocess.run([*cmd, *(["--quick"] if quick else [])], cwd=HERE.parent).returncode
        if result.exists():
            entry: dict[str, Any] = json.loads(result.read_text())
            return entry
    return {
        "quick": quick,
        "results": [],
        "error": f"the bench process exited with code {code}",
        "seconds": round(time.perf_counter() - started, 1),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def render(entries: dict[str, dict[str, Any]]) -> str:
    head = ("bench", "figure", "value", "baseline", "unit", "ratio", "target", "passed")
    rows, notes = [], []
    for mod, entry in entries.items():
        if entry["error"]:
            rows.append((mod, "ERROR", "-", "-", "-", "-", "-", "NO"))
            notes.append(f"{mod}: {entry['error']}")
        for r in entry["results"]:
            cells = [r[k] for k in ("value", "baseline", "unit", "ratio", "target", "passed")]
            rows.append((mod, r["name"], *map(fmt, cells)))
            notes.append(f"{mod} / {r['name']}: {r['note']}")
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    right = {2, 3, 5}  # numbers

    def line(cells: tuple[Any, ...]) -> str:
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(head), line(tuple("-" * w for w in widths)), *map(line, rows)]
    if notes:
        out += ["", "notes:", *(f"  - {n}" for n in notes)]
    return "\n".join(out)


def save(
    entries: dict[str, dict[str, Any]], quick: bool, load_before: tuple[float, ...] | None = None
) -> Path:
    """Merge into ``bench/out/results.json`` (atomic replace)."""
    try:
        old = json.loads(OUT.read_text())
        modules = old.get("modules", {}) if isinstance(old, dict) else {}
    except (OSError, ValueError):
        modules = {}
    modules.update(entries)
    doc = {
        "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "last_run": {
            "modules": list(entries),
            "quick": quick,
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "machine": report.machine(),
        "modules": dict(sorted(modules.items())),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(tmp, OUT)
    return OUT


def main(argv: list[str] | None = None) -> int:
    names = discover()
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run the benchmarks; every figure is printed next to a baseline measured "
        "in the same run, and written to bench/out/results.json and bench/RESULTS.md.",
    )
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        help=f"run only this benchmark (repeatable); one of: {', '.join(names)}",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument(
        "--in-process", action="store_true", help="run the benches in this process, one by one"
    )
    parser.add_argument("--child-result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    use_test_tokens()  # every control plane and worker of the benches has auth on
    selected = names
    if args.only:
        wanted = [n.removeprefix(PREFIX).removesuffix(".py") for n in args.only]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(names)}")
        selected = [n for n in names if n in wanted]
    if args.child_result:  # one bench, for run_isolated
        (name,) = selected
        args.child_result.write_text(json.dumps(run_module(name, args.quick), default=str))
        return 0
    load_before = os.getloadavg()
    entries: dict[str, dict[str, Any]] = {}
    for name in selected:
        print(f"running {name}{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
        run = run_module if args.in_process else run_isolated
        entries[name] = run(name, args.quick)
        print(f"  {name}: {entries[name]['seconds']} s", file=sys.stderr, flush=True)
    print(render(entries))
    path = save(entries, args.quick, load_before)
    md = report.write(path)
    print(f"\nwritten to {path.relative_to(HERE.parent)} and {md.relative_to(HERE.parent)}")
    missed = sum(r["passed"] is False for e in entries.values() for r in e["results"])
    errors = sum(e["error"] is not None for e in entries.values())
    print(f"{missed} figure(s) missed their target, {errors} benchmark(s) failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
