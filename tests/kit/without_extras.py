"""Run Python as the base install would: the modules of the ``worker`` and ``embedded``
extras cannot be imported (tests/integration/test_install_roles.py).

    python -m tests.kit.without_extras -c CODE
    python -m tests.kit.without_extras backfill ARGS...

REFUSE_EXTRAS=worker (or embedded) refuses one extra's modules only.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from types import ModuleType

# top-level modules that only the extras bring (pyproject.toml, [project.optional-dependencies])
EXTRA_MODULES = {"worker": {"pyspark", "py4j", "pyarrow"}, "embedded": {"pgserver"}}
EXTRAS_ONLY = frozenset().union(*EXTRA_MODULES.values())


class RefuseExtras(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: importing an extra's module fails as if it were absent."""

    def __init__(self, refused: frozenset[str]) -> None:
        self.refused = refused

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.partition(".")[0] in self.refused:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def install() -> None:
    extras = os.environ.get("REFUSE_EXTRAS", ",".join(EXTRA_MODULES)).split(",")
    refused = frozenset().union(*(EXTRA_MODULES[e] for e in extras))
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in refused)
    assert not loaded, f"already imported: {loaded}"
    sys.meta_path.insert(0, RefuseExtras(refused))


def main(argv: list[str]) -> int:
    install()
    if argv[:1] == ["-c"]:
        exec(compile(argv[1], "<without_extras>", "exec"), {"__name__": "__main__"})
        return 0
    if argv[:1] == ["backfill"]:
        from service.cli import main as backfill

        return backfill(argv[1:])
    raise SystemExit("usage: python -m tests.kit.without_extras (-c CODE | backfill ARGS...)")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
