"""Database access for the control plane: one engine per process, sessions per use case."""

from __future__ import annotations

import functools
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

import psycopg2
from pydantic_core import from_json, to_json
from sqlalchemy import Connection, Engine, Executable, Row, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from service.embedded_pg import EmbeddedPostgres, to_libpq_url, to_sqlalchemy_url
from service.settings import Settings
from state_store.options import NO_JIT, with_options

READER_POOL_SIZE = 8
# deadlock_detected and serialization_failure: Postgres rolled the victim back whole
RETRYABLE_PGCODES = frozenset({"40P01", "40001"})
DEADLOCK_ATTEMPTS = 3


# jsonb in and out through pydantic's JSON (in Rust) rather than the json module: a
# worker's poll reads some 700 small jsonb values for 100 actors (vnode ranges, columns,
# schemas) ten times a second (bench/HISTORY.md#progress-polling); the values
# are the same (jsonb holds no lone surrogate, the one input the two parse differently)
def json_text(value: Any) -> str:
    """``value`` as JSON text, as the catalog's connections encode jsonb."""
    return to_json(value).decode()


JSON_CODEC: dict[str, Any] = {"json_deserializer": from_json, "json_serializer": json_text}

P = ParamSpec("P")
T = TypeVar("T")


def retry_deadlocks(fn: Callable[P, T]) -> Callable[P, T]:
    """Run a use case again (up to ``DEADLOCK_ATTEMPTS`` times in all) when Postgres chose
    its transaction as a deadlock's victim. Only for use cases that are one transaction
    and have no effect outside it, so that a retry starts from scratch: a DML batch that
    met a barrier injection and a rescale in the other order was a 503 to its client."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except DBAPIError as e:
                code = getattr(e.orig, "pgcode", None)
                if code not in RETRYABLE_PGCODES or attempt == DEADLOCK_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    return run


class Database:
    def __init__(self, url: str, embedded: EmbeddedPostgres | None = None) -> None:
        self.url = to_sqlalchemy_url(url)
        self.libpq_url = to_libpq_url(self.url)
        self.embedded = embedded
        # the URL's own parameters (TLS's among them) reach psycopg2 as they are
        given = make_url(self.url).query.get("options")
        options = with_options(
            " ".join((given,) if isinstance(given, str) else given or ()), NO_JIT
        )
        self.engine: Engine = create_engine(
            self.url,
            pool_pre_ping=True,
            pool_size=20,
            max_overflow=20,
            future=True,
            connect_args={"options": options},
            **JSON_CODEC,
        )
        # Single-statement reads that pollers make many times a second get a pool of
        # their own: in autocommit (no BEGIN/ROLLBACK round trips) and without the
        # pre-ping (one more round trip per checkout, half a progress read's time under
        # load); a connection found dead is retried once instead (``first_alone``). The
        # pool is small and has no overflow: more concurrent statements than cores only
        # queue inside Postgres, and overflow connections opened and closed under a
        # burst cost a backend start each (23 a second in bench_progress_polling).
        self.readers: Engine = create_engine(
            self.url,
            isolation_level="AUTOCOMMIT",
            pool_size=READER_POOL_SIZE,
            max_overflow=0,
            pool_timeout=30,
            future=True,
            connect_args={"options": options},
            **JSON_CODEC,
        )
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        # The barrier loop's rounds (a few a barrier, ten barriers a second at 100 ms) on
        # connections of their own without the pre-ping, whose round trips were a fifth
        # of an idle round's statements. A connection found dead fails the round, and the
        # loop starts again from a recovery as after any failed round; the pool is then
        # invalidated whole, so the next round connects anew.
        self.loop_engine: Engine = create_engine(
            self.url,
            pool_size=2,
            max_overflow=8,
            future=True,
            connect_args={"options": options},
            **JSON_CODEC,
        )
        self.loop_sessions = sessionmaker(self.loop_engine, expire_on_commit=False)

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

    @contextmanager
    def loop_transaction(self) -> Iterator[Session]:
        """``transaction`` on the barrier loop's connections (``loop_engine``)."""
        with self.loop_sessions() as session, session.begin():
            yield session

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read-only session whose statements all see one snapshot (REPEATABLE READ).
        For reads at an epoch checked against ``gc_epoch``: a garbage collection that
        commits between the check and the reads would otherwise have removed versions
        they need (a key deleted after the epoch would be gone at it too)."""
        with self.sessions() as session, session.begin():
            session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
            yield session

    def first_alone(self, statement: Executable, params: dict[str, Any]) -> Row[Any] | None:
        """The first row of one read-only statement run outside a transaction (a
        statement reads one snapshot anyway): no BEGIN before it and no ROLLBACK after,
        two round trips fewer, for reads that pollers make many times a second. A
        connection that turns out dead (Postgres restarted) is retried once on a new one:
        the readers' pool has no pre-ping."""
        return self._alone(lambda conn: conn.execute(statement, params).first())

    def all_alone(self, statement: Executable, params: dict[str, Any]) -> list[Row[Any]]:
        """Every row of one read-only statement, as ``first_alone`` reads it."""
        return self._alone(lambda conn: list(conn.execute(statement, params).all()))

    def rows_alone(self, statement: Prepared, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Every row of one prepared read-only statement, as ``first_alone`` reads it."""
        return self._alone(functools.partial(_prepared_rows, statement, params))

    def _alone(self, read: Callable[[Connection], T]) -> T:
        for attempt in (1, 2):
            with self.readers.connect() as conn:
                try:
                    return read(conn)
                except DBAPIError as e:
                    if attempt == 2 or not e.connection_invalidated:
                        raise
                except (psycopg2.OperationalError, psycopg2.InterfaceError):
                    # a raw cursor's error (``rows_alone``), which SQLAlchemy does not see:
                    # retried only when the connection is dead
                    if attempt == 2 or not conn.connection.dbapi_connection.closed:  # type: ignore[union-attr]
                        raise
                    conn.invalidate()
        raise AssertionError("unreachable")

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception:
            return False

    def close(self) -> None:
        self.engine.dispose()
        self.readers.dispose()
        self.loop_engine.dispose()
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


_PARAM = re.compile(r"(?<![:\w]):(\w+)")


class Prepared:
    """Statements (``:name`` parameters) that Postgres parses and plans
    once per connection (``PREPARE``) and runs by name (``EXECUTE``), all in one round
    trip: the barrier loop sends the same ones at every round of every graph, and
    parsing and planning them was most of Postgres's work in a round
    (bench/HISTORY.md, 2026-11-29 02:50). ``types``: each parameter's SQL type.

    A prepared statement lasts as long as its session, whatever becomes of the
    transaction that prepared it; so each is prepared in a call of its own, and counted
    as prepared only once that call succeeded."""

    _done: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, name: str, types: Mapping[str, str], *statements: str) -> None:
        # (each statement's name, its PREPARE)
        self._prepare: list[tuple[str, str]] = []
        runs: list[str] = []
        for i, body in enumerate(q.strip() for q in statements):
            names = list(dict.fromkeys(_PARAM.findall(body)))
            numbered = _PARAM.sub(functools.partial(_numbered, names), body)
            declared = f"({', '.join(types[n] for n in names)})" if names else ""
            self._prepare.append((f"{name}_{i}", f"PREPARE {name}_{i}{declared} AS {numbered}"))
            args = f"({', '.join(f'%({n})s' for n in names)})" if names else ""
            runs.append(f"EXECUTE {name}_{i}{args}")
        self.text = ";\n".join(runs)

    def ready(self, cur: Any) -> str:
        """The text that runs the statements on ``cur``'s connection (psycopg2's
        parameters), preparing them there first if they are not yet."""
        with self._lock:  # the registry is shared; a connection is one thread's at a time
            done = self._done.setdefault(cur.connection, set())
        for name, prepare in self._prepare:
            if name not in done:
                cur.execute(prepare)
                done.add(name)
        return self.text


def _prepared_rows(
    statement: Prepared, params: dict[str, Any], conn: Connection
) -> list[tuple[Any, ...]]:
    with conn.connection.dbapi_connection.cursor() as cur:  # type: ignore[union-attr]
        cur.execute(statement.ready(cur), params)
        return list(cur.fetchall())


def _numbered(names: list[str], found: re.Match[str]) -> str:
    return f"${names.index(found.group(1)) + 1}"
