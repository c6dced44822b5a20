"""The embedded Postgres runs with the project's server settings, also when a setting
was changed behind its back (they are checked at every start)."""

from __future__ import annotations

from pathlib import Path

import psycopg2

from service.embedded_pg import SERVER_SETTINGS, EmbeddedPostgres, to_libpq_url
from tests.kit.e2e import wait_for


def _settings(url: str) -> dict[str, str]:
    conn = psycopg2.connect(to_libpq_url(url))
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                [list(SERVER_SETTINGS)],
            )
            return dict(cur.fetchall())
    finally:
        conn.close()


def _applied(url: str) -> bool:
    # a reload reaches the server's processes a moment after it is asked for
    return _settings(url) == SERVER_SETTINGS


def test_the_embedded_server_runs_with_the_server_settings(tmp_path: Path) -> None:
    first = EmbeddedPostgres(tmp_path)
    url = first.start()
    try:
        wait_for(lambda: _applied(url), 30, "the server settings")
        conn = psycopg2.connect(to_libpq_url(url))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("ALTER SYSTEM RESET ALL")
        conn.close()
    finally:
        first.stop()
    again = EmbeddedPostgres(tmp_path)
    url = again.start()
    try:
        assert _settings(url) != {} and wait_for(lambda: _applied(url), 30, "the server settings")
    finally:
        again.stop()
