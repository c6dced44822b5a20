"""Database access for the control plane: one engine per process, sessions per use case."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from service.embedded_pg import EmbeddedPostgres, to_libpq_url, to_sqlalchemy_url
from service.settings import Settings

# The store's reads are many short index walks (a UNION ALL branch per vnode): a server
# built with LLVM would JIT-compile every branch, which costs more than the query
# itself (measured: 11.5 s instead of 0.5 s for 1M rows over 128 vnodes).
NO_JIT = "-c jit=off"


class Database:
    def __init__(self, url: str, embedded: EmbeddedPostgres | None = None) -> None:
        self.url = to_sqlalchemy_url(url)
        self.libpq_url = to_libpq_url(self.url)
        self.embedded = embedded
        self.engine: Engine = create_engine(
            self.url,
            pool_pre_ping=True,
            pool_size=10,
            max_overflow=20,
            future=True,
            connect_args={"options": NO_JIT},
        )
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> Database:
        if settings.database_url is not None:
            return cls(settings.database_url)
        embedded = EmbeddedPostgres(settings.data_dir)
        return cls(embedded.start(), embedded)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error."""
        with self.sessions() as session, session.begin():
            yield session

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception:
            return False

    def close(self) -> None:
        self.engine.dispose()
        if self.embedded is not None:
            self.embedded.stop()


def raw_cursor(session: Session):  # type: ignore[no-untyped-def]
    """A psycopg2 cursor inside the session's transaction (for the state store)."""
    return session.connection().connection.dbapi_connection.cursor()


def unique_violation(error: Exception) -> str | None:
    """The constraint a unique violation (an IntegrityError's cause) broke, else None."""
    orig = getattr(error, "orig", None)
    if getattr(orig, "pgcode", None) != "23505":  # unique_violation
        return None
    return getattr(getattr(orig, "diag", None), "constraint_name", None)
