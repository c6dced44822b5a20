"""The shared core imports no I/O library, so both sides (and the models) can use it."""

import ast
import sys
from pathlib import Path

import backfill_core

CORE = Path(backfill_core.__file__).parent
ALLOWED_STDLIB = set(sys.stdlib_module_names) - {
    "socket", "ssl", "asyncio", "subprocess", "sqlite3", "urllib", "http", "time", "random",
    "threading", "multiprocessing", "selectors",
}  # fmt: skip


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_only_the_standard_library_and_itself() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert files, "the shared core has modules"
    offenders = {
        str(f.relative_to(CORE)): sorted(bad)
        for f in files
        if (bad := _imports(f) - ALLOWED_STDLIB - {"backfill_core", "__future__"})
    }
    assert offenders == {}


def test_the_checker_would_catch_an_io_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import sqlalchemy\nfrom pyspark.sql import SparkSession\nimport time\n")
    assert _imports(bad) - ALLOWED_STDLIB == {"sqlalchemy", "pyspark", "time"}
