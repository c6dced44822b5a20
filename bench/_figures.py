"""Figures the benches share: seconds against a same-run baseline."""

from __future__ import annotations

from typing import Any


def listed(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def seconds(
    name: str,
    value: float,
    baseline: float,
    at_most: float | None,
    note: str,
    *,
    ratio: float | None = None,
) -> dict[str, Any]:
    """A figure in seconds against its same-run baseline; ``at_most``: the target ratio
    (None: reported only); ``ratio``: when it is not ``value / baseline``."""
    ratio = value / baseline if ratio is None else ratio
    return {
        "name": name,
        "value": round(value, 2),
        "baseline": round(baseline, 2),
        "ratio": round(ratio, 2),
        "target": "report" if at_most is None else f"<= {at_most}",
        "unit": "s",
        "passed": None if at_most is None else ratio <= at_most,
        "note": note,
    }
