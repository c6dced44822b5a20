"""The base package is the control plane: it runs without the ``worker`` and ``embedded``
extras (pyproject.toml; docs/operations.md, "Installing by role"), and the commands that need
an extra say which one instead of a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.embedded_pg import to_libpq_url

ROOT = Path(__file__).resolve().parents[2]


def without_extras(
    *args: str, env: dict[str, str] | None = None, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-m", "tests.kit.without_extras", *args],
        cwd=ROOT,
        env={**inherited, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


CONTROL_PLANE = """
import json, sys
from fastapi.testclient import TestClient
from service.api.app import create_app
from service.settings import Settings
from tests.kit.without_extras import EXTRAS_ONLY

app = create_app(Settings(database_url=sys.argv[-1], spawn_embedded_worker=False))
with TestClient(app) as client:
    codes = [client.get(path).status_code for path in ("/healthz", "/readyz")]
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in EXTRAS_ONLY)
print(json.dumps({"codes": codes, "loaded": loaded}))
"""


@pytest.mark.db
def test_control_plane_serves_without_the_extras(fresh_db_url: str) -> None:
    code = CONTROL_PLANE.replace("sys.argv[-1]", repr(to_libpq_url(fresh_db_url)))
    r = without_extras("-c", code)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result == {"codes": [200, 200], "loaded": []}


def test_the_blocker_does_block() -> None:
    r = without_extras("-c", "import pyspark")
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr


def test_worker_without_the_worker_extra_says_what_to_install() -> None:
    r = without_extras("backfill", "worker", "--control-plane", "http://127.0.0.1:1")
    assert r.returncode == 2, r.stderr
    assert "mv-backfill[worker]" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("command", [("serve",), ("db", "current")])
def test_embedded_default_without_the_embedded_extra_says_what_to_do(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    r = without_extras(
        "backfill",
        *command,
        env={"BACKFILL_DATA_DIR": str(tmp_path)},
        unset=("DATABASE_URL", "BACKFILL_DATABASE_URL"),
    )
    assert r.returncode == 2, r.stderr
    assert "DATABASE_URL" in r.stderr and "mv-backfill[embedded]" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "pgdata").exists()


def test_embedded_postgres_without_pgserver_raises_a_typed_error(tmp_path: Path) -> None:
    code = (
        "from service.embedded_pg import EmbeddedPostgres, EmbeddedPostgresMissing\n"
        f"try:\n    EmbeddedPostgres({str(tmp_path)!r}).start()\n"
        "except EmbeddedPostgresMissing as e:\n    print(e.code)\n"
    )
    r = without_extras("-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "embedded_postgres_missing"


def test_serve_embedded_without_the_worker_extra_says_what_to_do(tmp_path: Path) -> None:
    # pgserver there, Spark not: the worker `serve` would start could never run
    r = without_extras(
        "backfill",
        "serve",
        "--data-dir",
        str(tmp_path),
        env={"REFUSE_EXTRAS": "worker"},
        unset=("DATABASE_URL", "BACKFILL_DATABASE_URL", "BACKFILL_SPAWN_EMBEDDED_WORKER"),
    )
    assert r.returncode == 2, r.stderr
    assert "mv-backfill[worker]" in r.stderr and "BACKFILL_SPAWN_EMBEDDED_WORKER" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "pgdata").exists()
