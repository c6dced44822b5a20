"""libpq options of the connections to the store's Postgres (control plane and workers)."""

from typing import Any

# The store's reads are many short index walks (a UNION ALL branch per vnode): a server
# built with LLVM would JIT-compile every branch, which costs far more than the query
# itself (bench/HISTORY.md#jit-off).
NO_JIT = "-c jit=off"
# A worker's writes need not wait for the WAL flush one by one: waiting would add a flush
# per actor, read and epoch, which the upstream's commits queue behind on a shared
# server. They are flushed once, before the collects that vouch for them go out
# (``flush_wal``): a collect outlives a crash of Postgres (the worker sends it again once
# the server is back), and without the flush it committed an epoch whose writes the
# crash had lost (docs/architecture.md#the-workers).
WORKER_DATA_OPTIONS = NO_JIT + " -c synchronous_commit=off"


def flush_wal(conn: Any) -> None:
    """Commit a transaction of ``conn`` that waits for the WAL flush: every write committed
    before it, by any connection, is then durable. (A commit waits only when its
    transaction wrote WAL: a transactional logical message is the smallest such write.)"""
    with conn.cursor() as cur:
        cur.execute(
            "SET LOCAL synchronous_commit = on; "
            "SELECT pg_logical_emit_message(true, 'backfill', 'flush')"
        )
    conn.commit()


def with_options(given: str | None, ours: str) -> str:
    """libpq ``options`` of a URL's own (``?options=...``) and ours after them: passing
    ours alone as ``options=`` would replace the URL's."""
    return f"{given} {ours}" if given else ours


def worker_dsn(url: str) -> str:
    """The connection string a worker and its Spark tasks connect with: every parameter of
    the URL it was handed (TLS's ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``
    among them) and ``WORKER_DATA_OPTIONS``."""
    from psycopg2.extensions import make_dsn, parse_dsn

    return make_dsn(url, options=with_options(parse_dsn(url).get("options"), WORKER_DATA_OPTIONS))
