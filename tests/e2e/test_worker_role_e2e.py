"""Workers on their own database role (``backfill db create-worker-role``, handed out as
``BACKFILL_WORKER_DATABASE_URL``): every kind of table backfill through Spark is exact, so
the role's grants are all that workers and their Spark tasks need."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg2
import pytest
from psycopg2 import sql
from sqlalchemy.engine import make_url

from service.db import Database
from service.worker_role import create_worker_role
from spark_workers.settings import WorkerSettings
from tests.kit.e2e import assert_exact, create_job, load, running_cluster, wait_created

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture
def worker_url(db: Database) -> Iterator[str]:
    role = f"w_{uuid.uuid4().hex[:12]}"
    conn = psycopg2.connect(db.libpq_url)
    try:
        create_worker_role(conn, role)
        # the embedded server trusts its unix socket: the role's name is enough to log in
        yield make_url(db.url).set(username=role, password=None).render_as_string(False)
    finally:
        conn.rollback()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            cur.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
        conn.close()


def test_every_table_backfill_is_exact_on_the_workers_own_role(
    db: Database, fresh_db_url: str, worker_url: str
) -> None:
    settings = WorkerSettings(spark_min_rows=20_000, spark_epoch_rows=30_000)
    with running_cluster(db, fresh_db_url, settings, "role", worker_database_url=worker_url) as (
        http,
        _,
    ):
        load(http, 60_000)
        # arrangement's Spark jobs span epochs (work queues and rounds), snapshot's run per
        # epoch: between them every table a worker's Spark path touches (chain reads as
        # arrangement does, and costs CI another minute or two)
        jobs = [create_job(http, f"mv_{kind}", kind) for kind in ("arrangement", "snapshot")]
        for job in jobs:
            wait_created(http, job, timeout=300)
            assert_exact(http, job)
