"""The embedded default: a private Postgres from the ``pgserver`` wheel under a data dir."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    """Starts (or joins) the server of ``data_dir/pgdata``; data survives restarts."""

    def __init__(self, data_dir: Path, *, stop_on_exit: bool = True) -> None:
        self.pgdata = Path(data_dir).resolve() / "pgdata"
        self._stop_on_exit = stop_on_exit
        self._server: Any = None

    def start(self) -> str:
        """Start the server if needed; returns a SQLAlchemy URL (psycopg2, unix socket)."""
        os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

            # pgserver logs every pg_ctl command line at INFO
            logging.getLogger("pgserver").setLevel(logging.WARNING)

            self.pgdata.mkdir(parents=True, exist_ok=True)
            self._server = pgserver.get_server(
                self.pgdata, cleanup_mode="stop" if self._stop_on_exit else None
            )
        uri: str = self._server.get_uri()
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

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None


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
