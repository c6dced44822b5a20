"""The project's Python code as one zip that the worker ships to its Spark executors
(``SparkContext.addPyFile``): executors import our data sources and tasks by reference, so
without it they run only where the package is installed. With it, a cluster whose Python
has pyspark, pyarrow and psycopg2 (and confluent-kafka for Kafka sources) runs them
(docs/operations.md, "An existing Spark cluster").

The zip holds the packages the executors import, never the control plane (``service``);
each module as its source and as bytecode, so that every Python worker Spark starts does
not compile them again (zipimport cannot cache bytecode of its own).
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import marshal
import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

# what spark_workers' data sources and tasks import, and what those import
PACKAGES = ("backfill_core", "state_store", "connectors", "spark_workers")
ZIP_NAME = "mv_backfill_code.zip"
# bytecode marked "unchecked hash-based" (PEP 552): zipimport takes it as is
_UNCHECKED_HASH = 0b01
# the zip's directory: this prefix, the pid of the process it belongs to, a random part
DIR_PREFIX = "mv-backfill-code-"
_OWNED_DIR = re.compile(re.escape(DIR_PREFIX) + r"(\d+)-")


def package_dir(name: str) -> Path:
    """Where a package's modules are, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name} not found")
    return Path(next(iter(spec.submodule_search_locations)))


def _bytecode(source: bytes, filename: str) -> bytes:
    code = compile(source, filename, "exec", dont_inherit=True)
    flags = _UNCHECKED_HASH.to_bytes(4, "little")
    return (
        importlib.util.MAGIC_NUMBER
        + flags
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def write_code_zip(path: str | os.PathLike[str]) -> None:
    """Write ``PACKAGES``' modules (``.py`` and ``.pyc`` side by side) to a zip at ``path``."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in PACKAGES:
            root = package_dir(name)
            for py in sorted(root.rglob("*.py")):
                if "__pycache__" in py.parts:
                    continue
                arcname = (Path(name) / py.relative_to(root)).as_posix()
                source = py.read_bytes()
                zf.writestr(arcname, source)
                zf.writestr(arcname + "c", _bytecode(source, arcname))


@functools.cache
def code_zip() -> str:
    """The zip's path: built once per process, in a directory removed when it exits (and,
    should it be killed, by the next worker on the machine: ``sweep_orphans``)."""
    sweep_orphans(tempfile.gettempdir())
    tmp = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, tmp, True)
    path = os.path.join(tmp, ZIP_NAME)
    write_code_zip(path)
    return path


def sweep_orphans(parent: str) -> list[str]:
    """Remove the zip directories under ``parent`` whose process is gone (a worker killed
    with SIGKILL runs no ``atexit``); the paths removed. A directory whose pid a live
    process has again is left, as are those of other users."""
    removed = []
    for entry in os.scandir(parent):
        found = _OWNED_DIR.match(entry.name)
        if found is None or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.getuid():
            continue
        if _alive(int(found.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def ship_code(spark: Any) -> None:
    """Add the zip to the executors' Python path in ``spark``'s context; before the data
    sources are registered, which capture the context's Python includes then."""
    from pyspark import SparkFiles

    sc = spark.sparkContext
    if ZIP_NAME in sc._python_includes:  # a session this process started before
        return
    sc.addPyFile(code_zip())
    # addPyFile puts the copy on the driver's path too, ahead of the installed package the
    # driver is already running: the driver keeps importing its own
    copy = os.path.join(SparkFiles.getRootDirectory(), ZIP_NAME)
    sys.path[:] = [p for p in sys.path if p != copy]
