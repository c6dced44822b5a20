"""Worker process entry point (the worker protocol arrives with the meta issue)."""

from __future__ import annotations

import sys


def run_worker(control_plane_url: str, name: str | None = None) -> int:
    print(
        f"error: the worker protocol is not available in this version "
        f"(control plane {control_plane_url})",
        file=sys.stderr,
    )
    return 2
