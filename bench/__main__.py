"""``make bench``: run every benchmark in this folder and print figures next to baselines.

A bench module is ``bench/bench_<name>.py`` with ``run(quick: bool) -> list[dict]``; each
dict has ``name, value, baseline, ratio, target, unit, passed`` (bool or None) and
``note``. The figures also go to ``bench/out/results.json`` (merged per module, so
``--only`` keeps the other modules' last figures) for a later report to collect.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import pkgutil
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

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
        entry["error"] = f"{type(e).__name__}: {e}"
    entry["seconds"] = round(time.perf_counter() - started, 1)
    entry["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return entry


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float | int):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    return str(v)


def render(entries: dict[str, dict[str, Any]]) -> str:
    head = ("bench", "figure", "value", "baseline", "unit", "ratio", "target", "passed")
    rows, notes = [], []
    for mod, entry in entries.items():
        if entry["error"]:
            rows.append((mod, "ERROR", "-", "-", "-", "-", "-", "NO"))
            notes.append(f"{mod}: {entry['error']}")
        for r in entry["results"]:
            cells = [r[k] for k in ("value", "baseline", "unit", "ratio", "target", "passed")]
            rows.append((mod, r["name"], *map(_fmt, cells)))
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


def save(entries: dict[str, dict[str, Any]], quick: bool) -> Path:
    """Merge into ``bench/out/results.json`` (atomic replace)."""
    try:
        old = json.loads(OUT.read_text())
        modules = old.get("modules", {}) if isinstance(old, dict) else {}
    except (OSError, ValueError):
        modules = {}
    modules.update(entries)
    doc = {
        "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "last_run": {"modules": list(entries), "quick": quick},
        "machine": {
            "host": platform.node(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
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
        "in the same run, and written to bench/out/results.json.",
    )
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        help=f"run only this benchmark (repeatable); one of: {', '.join(names)}",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args(argv)
    use_test_tokens()  # every control plane and worker of the benches has auth on
    selected = names
    if args.only:
        wanted = [n.removeprefix(PREFIX).removesuffix(".py") for n in args.only]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(names)}")
        selected = [n for n in names if n in wanted]
    entries: dict[str, dict[str, Any]] = {}
    for name in selected:
        print(f"running {name}{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
        entries[name] = run_module(name, args.quick)
        print(f"  {name}: {entries[name]['seconds']} s", file=sys.stderr, flush=True)
    print(render(entries))
    path = save(entries, args.quick)
    print(f"\nwritten to {path.relative_to(HERE.parent)}")
    missed = sum(r["passed"] is False for e in entries.values() for r in e["results"])
    errors = sum(e["error"] is not None for e in entries.values())
    print(f"{missed} figure(s) missed their target, {errors} benchmark(s) failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
