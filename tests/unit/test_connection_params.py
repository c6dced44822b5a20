"""TLS settings in a database URL (``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``)
reach every connection: the control plane's engines, the URL handed to workers, the
plans Spark tasks receive and the connection strings workers and tasks connect with."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from psycopg2.extensions import parse_dsn
from sqlalchemy import Engine, event

from backfill_core.protocol import MvWrite, TablePlan
from backfill_core.schema import Column, ColumnType, TableSchema
from service.db import Database
from service.embedded_pg import to_libpq_url
from state_store.options import NO_JIT, WORKER_DATA_OPTIONS, worker_dsn

ROOT = Path(__file__).resolve().parents[2]
TLS = {
    "sslmode": "verify-full",
    "sslrootcert": "/etc/backfill/ca.pem",
    "sslcert": "/etc/backfill/client.pem",
    "sslkey": "/etc/backfill/client.key",
}
QUERY = "&".join(f"{k}={v}" for k, v in TLS.items())
URL = f"postgresql://backfill_worker:s3cret@db.example:6432/backfill?{QUERY}"


def test_workers_and_tasks_connect_with_the_urls_tls_settings() -> None:
    params = parse_dsn(worker_dsn(URL))
    assert {k: params[k] for k in TLS} == TLS
    assert (params["host"], params["port"], params["dbname"]) == ("db.example", "6432", "backfill")
    assert (params["user"], params["password"]) == ("backfill_worker", "s3cret")
    assert params["options"] == WORKER_DATA_OPTIONS


def test_a_urls_own_options_are_kept_before_the_workers() -> None:
    params = parse_dsn(worker_dsn(f"{URL}&options=-c%20search_path%3Dother"))
    assert params["options"] == f"-c search_path=other {WORKER_DATA_OPTIONS}"
    assert params["sslmode"] == "verify-full"


def test_the_url_handed_to_workers_and_put_in_task_plans_keeps_its_query() -> None:
    handed = to_libpq_url(URL.replace("postgresql://", "postgresql+psycopg2://"))
    assert handed == URL
    schema = TableSchema.build([Column("k", ColumnType.BIGINT, False)], ["k"])
    plan = TablePlan(
        MvWrite(handed, "mv", schema, ["k"], None, 1, 0, 0), "t", schema, 1, [[]], [], "q"
    )
    assert TablePlan.from_text(plan.to_text()).write.dsn == URL


class _Stop(Exception):
    """Raised instead of connecting: the test needs only what would be connected with."""


def connect_params(engine: Engine) -> dict[str, str]:
    """The keywords ``engine`` would call psycopg2.connect with (it does not connect)."""
    seen: dict[str, str] = {}

    @event.listens_for(engine, "do_connect")
    def capture(dialect, record, cargs, cparams):  # type: ignore[no-untyped-def]
        seen.update(cparams)
        raise _Stop

    with pytest.raises(_Stop):
        engine.connect()
    return seen


def test_the_control_planes_engines_pass_the_tls_settings_to_psycopg2() -> None:
    db = Database(f"{URL}&options=-c%20statement_timeout%3D5s")  # engines connect lazily
    try:
        for engine in (db.engine, db.readers, db.loop_engine):
            params = connect_params(engine)
            assert {k: params[k] for k in TLS} == TLS
            assert params["options"] == f"-c statement_timeout=5s {NO_JIT}"
        assert db.libpq_url.startswith(URL)
    finally:
        db.engine.dispose()
        db.readers.dispose()


def test_every_worker_connection_goes_through_worker_dsn() -> None:
    """psycopg2's ``options=`` keyword would replace a URL's own; worker_dsn keeps both."""
    for path in sorted((ROOT / "spark_workers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "connect"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "psycopg2"
            ):
                where = f"{path.name}:{node.lineno}"
                assert not node.keywords, f"{where} passes keywords besides the URL's"
                (arg,) = node.args
                assert (
                    isinstance(arg, ast.Call)
                    and isinstance(arg.func, ast.Name)
                    and arg.func.id == "worker_dsn"
                ), f"{where} connects without worker_dsn"
