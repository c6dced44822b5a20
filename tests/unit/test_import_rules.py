"""Which package may import which: the worker stands on the shared packages only, never on
the control plane, and the shared packages (core, store, connectors) on neither side.

Every import counts, at module level or inside a function (a lazy import is still a
dependency), and so does ``importlib.import_module`` / ``__import__`` of a literal name.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# package -> the top-level packages it must not import
FORBIDDEN: dict[str, frozenset[str]] = {
    "spark_workers": frozenset({"service"}),
    "backfill_core": frozenset({"service", "spark_workers"}),
    "state_store": frozenset({"service", "spark_workers"}),
    "connectors": frozenset({"service", "spark_workers"}),
}
DYNAMIC_IMPORTS = frozenset({"import_module", "__import__"})


def imported_packages(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import anywhere in ``source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            arg = node.args[0]
            if name in DYNAMIC_IMPORTS and isinstance(arg, ast.Constant):
                found.append((node.lineno, str(arg.value).split(".")[0]))
    return found


def violations(package: str) -> list[str]:
    forbidden = FORBIDDEN[package]
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package} has modules"
    return [
        f"{f.relative_to(ROOT)}:{line} imports {name}"
        for f in files
        for line, name in imported_packages(f.read_text(), str(f))
        if name in forbidden
    ]


def test_the_worker_imports_nothing_from_the_control_plane() -> None:
    assert violations("spark_workers") == []


def test_the_shared_packages_import_neither_side() -> None:
    offenders = [v for p in ("backfill_core", "state_store", "connectors") for v in violations(p)]
    assert offenders == []


def test_the_checker_sees_every_kind_of_import() -> None:
    source = (
        "import os\n"
        "import service.db as db\n"
        "from service.settings import Settings\n"
        "from . import sibling\n"
        "def f():\n"
        "    from spark_workers.runtime import Worker\n"
        "    import importlib\n"
        "    return importlib.import_module('service.meta.sources')\n"
        "def g():\n"
        "    return __import__('connectors.kafka')\n"
    )
    assert imported_packages(source) == [
        (1, "os"),
        (2, "service"),
        (3, "service"),
        (6, "spark_workers"),
        (7, "importlib"),
        (8, "service"),
        (10, "connectors"),
    ]
