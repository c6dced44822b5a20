"""The embedded default: a private Postgres from the ``pgserver`` wheel under a data dir."""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# pgserver comes with the `embedded` extra only (no linux-aarch64 wheel: docs/operations.md)
MISSING_PGSERVER = (
    "DATABASE_URL is not set, so the service would run an embedded Postgres, which needs "
    "pgserver: set DATABASE_URL to your Postgres, or install mv-backfill[embedded]"
)


class EmbeddedPostgresMissing(ImportError):
    """The embedded default was asked for without the ``embedded`` extra installed."""

    code = "embedded_postgres_missing"


def embedded_available() -> bool:
    try:
        import pgserver  # noqa: F401
    except ImportError:
        return False
    return True


class EmbeddedPostgres:
    """Starts (or joins) the server of ``data_dir/pgdata``; data survives restarts."""

    def __init__(self, data_dir: Path, *, stop_on_exit: bool = True) -> None:
        self.pgdata = Path(data_dir).resolve() / "pgdata"
        self._stop_on_exit = stop_on_exit
        self._server: Any = None
        self._restarted = False

    def start(self) -> str:
        """Start the server if needed; returns a SQLAlchemy URL (psycopg2, unix socket)."""
        os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                import pgserver
            except ImportError as e:
                raise EmbeddedPostgresMissing(MISSING_PGSERVER) from e

            # pgserver logs every pg_ctl command line at INFO
            logging.getLogger("pgserver").setLevel(logging.WARNING)

            self.pgdata.mkdir(parents=True, exist_ok=True)
            self._server = pgserver.get_server(
                self.pgdata, cleanup_mode="stop" if self._stop_on_exit else None
            )
        uri: str = self._server.get_uri()
        if _configure(uri):
            # a fresh data dir (or one whose settings were changed behind our back)
            self.restart("fast")
        log.info("embedded Postgres running under %s", self.pgdata)
        return to_sqlalchemy_url(uri)

    def restart(self, mode: str = "immediate") -> None:
        """Restart the running server (``immediate``: as after a crash, with recovery);
        the socket and options stay, so clients reconnect to the same URL."""
        from pgserver._commands import pg_ctl

        assert self._server is not None, "not started"
        log = str(self.pgdata / "log")
        pg_ctl(
            ["-w", "-m", mode, "-l", log, "restart"],
            pgdata=self.pgdata,
            user=self._server.system_user,
        )
        self._restarted = True

    def stop(self) -> None:
        if self._server is not None:
            user = self._server.system_user
            self._server.cleanup()
            self._server = None
            if self._stop_on_exit and self._restarted and (self.pgdata / "postmaster.pid").exists():
                # pgserver stops the postmaster it started, which a restart replaced
                from pgserver._commands import pg_ctl

                pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=user)


# Server settings of the embedded Postgres (kept in its postgresql.auto.conf).
SERVER_SETTINGS = {
    # A new 16 MB WAL segment is otherwise written full of zeros and flushed while the
    # WAL write lock is held: every commit waits meanwhile. A backfill writes WAL fast
    # enough to need a new segment every second or two, and each one stalled the
    # upstream's barrier commits (bench/HISTORY.md#the-embedded-postgress-settings).
    # Without zero-filling, the segment's last byte is written and space is taken as WAL
    # is written.
    "wal_init_zero": "off",
    # 1 GiB of buffers (in 8 kB pages; the default is 128 MB). A backfill reads its
    # upstream through the key index and writes the MV beside it: at 128 MB every page
    # read evicted one, often a dirty one the statement had to write out itself. Memory
    # is taken as pages are used.
    "shared_buffers": "131072",
    # 128 MB of WAL buffers (in 8 kB pages; 16 MB by default with such shared_buffers).
    # With 16 MB a backfill's WAL filled them again and again, and each time a backend
    # wrote WAL itself, holding the WAL write lock that the other statement then waited
    # on; with 128 MB the WAL writer writes nearly all of it.
    "wal_buffers": "16384",
}


def _configure(uri: str) -> bool:
    """Apply ``SERVER_SETTINGS`` where they differ; whether one waits for a restart."""
    import psycopg2

    conn = psycopg2.connect(uri)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(
                "SELECT name, context = 'postmaster' FROM pg_settings WHERE name = ANY(%s) "
                "AND setting IS DISTINCT FROM (%s::jsonb ->> name)",
                [list(SERVER_SETTINGS), json.dumps(SERVER_SETTINGS)],
            )
            found = cur.fetchall()
            stale = [name for name, _ in found]
            for name in stale:
                # names and values are this module's constants, not input
                cur.execute(f"ALTER SYSTEM SET {name} = %s", [SERVER_SETTINGS[name]])
            if stale:
                cur.execute("SELECT pg_reload_conf()")
            # a setting of the postmaster's takes effect only when it starts again
            return any(at_start for _, at_start in found)
    finally:
        conn.close()


def to_sqlalchemy_url(url: str) -> str:
    """Any postgres URL -> the psycopg2 dialect SQLAlchemy uses."""
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix) :]
    raise ValueError("not a postgres URL")


def to_libpq_url(url: str) -> str:
    """A SQLAlchemy URL -> a plain libpq URL (for psycopg2.connect and workers)."""
    for prefix in ("postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url
