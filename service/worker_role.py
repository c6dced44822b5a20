"""The workers' own database role (``backfill db create-worker-role``; docs/operations.md,
"A database role for the workers"): what a worker and its Spark tasks read and write, and
nothing of the catalog's control (tokens, jobs, the control plane's tables).

What workers touch (spark_workers/, state_store/): every table of the schema ``store``
(upstream versions read, MV versions written, through temporary staging tables); the
fences they read (``graphs``, ``actors``, ``split_progress``); the work tables of pushed-down
Spark jobs (``work_queues``, ``work_rounds``). Advisory locks need no grant.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

# tables of the default schema the workers read, and those they write
READ_TABLES = ("graphs", "actors", "split_progress")
WORK_TABLES = ("work_queues", "work_rounds")
# A fence reads its graph's row FOR SHARE, which Postgres allows only with the UPDATE
# privilege on one column of the table at least: the one column no code reads.
FOR_SHARE_COLUMN = ("graphs", "created_at")
DML = sql.SQL("SELECT, INSERT, UPDATE, DELETE")


def _role_exists(cur: Any, role: str) -> bool:
    cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
    return cur.fetchone() is not None


def grant_statements(role: str, database: str) -> list[sql.Composed]:
    """The grants, each idempotent (granting again changes nothing)."""
    r = sql.Identifier(role)
    table, column = FOR_SHARE_COLUMN
    return [
        sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(
            sql.Identifier(database), r
        ),
        sql.SQL("GRANT USAGE ON SCHEMA public, store TO {}").format(r),
        sql.SQL("GRANT {} ON ALL TABLES IN SCHEMA store TO {}").format(DML, r),
        # the tables this role (the control plane's) creates in store later: new MVs
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA store GRANT {} ON TABLES TO {}").format(DML, r),
        sql.SQL("GRANT SELECT ON {} TO {}").format(
            sql.SQL(", ").join(map(sql.Identifier, READ_TABLES)), r
        ),
        sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(
            sql.Identifier(column), sql.Identifier(table), r
        ),
        sql.SQL("GRANT {} ON {} TO {}").format(
            DML, sql.SQL(", ").join(map(sql.Identifier, WORK_TABLES)), r
        ),
    ]


def create_worker_role(conn: Any, role: str, password: str | None = None) -> bool:
    """Create ``role`` (LOGIN, no other attribute) unless it exists, set its password when
    given, and grant it what workers need in ``conn``'s database; whether it was created.
    Run after ``backfill db upgrade``, as the role the control plane connects with (the
    owner of the catalog and of the store's tables)."""
    with conn.cursor() as cur:
        created = not _role_exists(cur, role)
        if created:
            cur.execute(
                sql.SQL(
                    "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION"
                ).format(sql.Identifier(role))
            )
        if password is not None:
            cur.execute(
                sql.SQL("ALTER ROLE {} PASSWORD %s").format(sql.Identifier(role)), [password]
            )
        cur.execute("SELECT current_database()")
        (database,) = cur.fetchone()
        for statement in grant_statements(role, database):
            cur.execute(statement)
    conn.commit()
    return created
