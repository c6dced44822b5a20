"""bench/RESULTS.md rendered from a small fabricated results.json (no benchmark runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import report


def _figure(name: str, value: Any, baseline: Any, ratio: Any, passed: bool | None) -> dict:
    return {
        "name": name,
        "value": value,
        "baseline": baseline,
        "ratio": ratio,
        "target": "<= 1.5",
        "unit": "s",
        "passed": passed,
        "note": f"about {name}",
    }


def _doc(timeline_quick: bool) -> dict[str, Any]:
    return {
        "written_at": "2030-01-02T03:04:05+00:00",
        "last_run": {
            "modules": ["backfill", "timeline"],
            "load_before": [1.5, 1.0, 0.5],
            "load_after": [2.0, 1.0, 0.5],
        },
        "machine": {"host": "box", "cpus": 2, "python": "3.11.7", "cpu": "Some CPU"},
        "modules": {
            "backfill": {
                "quick": False,
                "error": None,
                "seconds": 42.0,
                "finished_at": "2030-01-02T03:00:00+00:00",
                "results": [
                    _figure("MV creation vs INSERT ... SELECT", 12.7, 3.7, 3.43, False),
                    _figure("MV creation vs a plain PySpark copy job", 12.7, 9.1, 1.4, True),
                    _figure("a | piped name", 1234567.0, None, None, None),
                ],
            },
            "broken": {
                "quick": False,
                "error": "RuntimeError: no server",
                "seconds": 1.0,
                "finished_at": "2030-01-02T03:01:00+00:00",
                "results": [],
            },
            "timeline": {
                "quick": timeline_quick,
                "error": None,
                "seconds": 30.0,
                "finished_at": "2030-01-02T03:04:00+00:00",
                "results": [_figure("one backfill's mean rate", 90_000, 300_000, 0.3, None)],
            },
        },
    }


def _write(tmp_path: Path, doc: dict[str, Any], plots: bool = True) -> str:
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(doc))
    if plots:
        for name, _ in report.PLOTS:
            (out / name).write_bytes(b"\x89PNG")
    md = report.write(out / "results.json", tmp_path / "RESULTS.md")
    assert md == tmp_path / "RESULTS.md"
    return md.read_text()


def test_full_run_tables_ratios_and_plot_links(tmp_path: Path) -> None:
    text = _write(tmp_path, _doc(timeline_quick=False))
    assert text.startswith("# Benchmark results\n")
    assert "QUICK RUN" not in text and "(quick)" not in text
    assert "2030-01-02T03:04:05+00:00" in text
    assert "## How to read" in text and "same run" in text
    # machine facts, with the load before the run
    assert "| cpus | 2 |" in text and "| cpu | Some CPU |" in text
    assert "before the last run | 1.50, 1.00, 0.50 |" in text
    assert "after the last run | 2.00, 1.00, 0.50 |" in text
    # the overview: each figure with its baseline, ratio, target and pass
    assert (
        "| backfill | MV creation vs INSERT ... SELECT | 12.7 | 3.7 | s | 3.43 | <= 1.5 | NO |"
        in (text)
    )
    assert (
        "| backfill | MV creation vs a plain PySpark copy job | 12.7 | 9.1 | s | 1.4 | <= 1.5 | yes |"
        in (text)
    )
    # big numbers grouped, missing cells dashed, pipes escaped
    assert "| backfill | a \\| piped name | 1,234,567 | - | s | - | <= 1.5 | - |" in text
    assert "| broken | ERROR | - | - | - | - | - | NO |" in text
    # per-module sections with notes and the failure
    assert "### backfill" in text and "Run 2030-01-02T03:00:00+00:00, full, 42 s." in text
    assert "* MV creation vs INSERT ... SELECT: about MV creation vs INSERT ... SELECT" in text
    assert "**Failed:** `RuntimeError: no server`" in text
    # plots linked relative to RESULTS.md, and present
    assert "](out/throughput.png)" in text and "](out/lag.png)" in text
    assert "missing" not in text


def test_quick_run_is_labelled(tmp_path: Path) -> None:
    text = _write(tmp_path, _doc(timeline_quick=True), plots=False)
    banner = next(line for line in text.splitlines() if "QUICK RUN" in line)
    assert "timeline" in banner and "backfill" not in banner
    assert "| timeline (quick) | one backfill's mean rate | 90,000 | 300,000 |" in text
    assert "Run 2030-01-02T03:04:00+00:00, **--quick**, 30 s." in text
    assert "(a **--quick** run)" in text
    # the links stay, and say the files are not there
    assert "](out/throughput.png)" in text and "(missing: `out/lag.png` was not written)" in text


def test_no_timeline_no_plot_links(tmp_path: Path) -> None:
    doc = _doc(timeline_quick=False)
    del doc["modules"]["timeline"]
    text = _write(tmp_path, doc)
    assert "No plots" in text and ".png)" not in text


def test_a_partial_run_keeps_the_other_benches_figures(tmp_path: Path) -> None:
    """results.json is not committed: a ``--only backfill`` run on a fresh machine must not
    drop the figures RESULTS.md holds for the other benches."""
    first = _write(tmp_path, _doc(timeline_quick=False))
    later = _doc(timeline_quick=False)
    later["modules"] = {"backfill": later["modules"]["backfill"]}
    later["modules"]["backfill"]["finished_at"] = "2030-02-01T00:00:00+00:00"
    (tmp_path / "out" / "results.json").write_text(json.dumps(later))
    text = report.write(tmp_path / "out" / "results.json", tmp_path / "RESULTS.md").read_text()
    assert "Run 2030-02-01T00:00:00+00:00, full, 42 s." in text
    for kept in (
        "| timeline | one backfill's mean rate | 90,000 | 300,000 |",
        "| broken | ERROR | - | - | - | - | - | NO |",
        "Run 2030-01-02T03:04:00+00:00, full, 30 s.",
        "**Failed:** `RuntimeError: no server`",
    ):
        assert kept in first and kept in text
    assert text.count("### timeline") == 1 and text.count("| timeline |") == 1
    assert "](out/throughput.png)" in text and "No plots" not in text
    # a rewrite from the same document changes nothing
    again = report.write(tmp_path / "out" / "results.json", tmp_path / "RESULTS.md").read_text()
    assert again == text
