"""The zombie fence where mutants survived the Postgres tests (`make mutation
MUTATION_SET=commit`, issue 39): the refusal names its graph, which is what the worker
acts on (``WorkerRuntime`` drops the actors of ``Fenced.graph_id`` as superseded)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient

from service.db import Database
from service.meta.loop import MetaLoop
from spark_workers.actors import Fenced, fence
from tests.kit.meta import FakeWorker, make_job


@pytest.fixture
def actor_conn(db: Database) -> Iterator[Any]:
    conn = psycopg2.connect(db.libpq_url)
    yield conn
    conn.close()


def test_the_fence_lets_the_current_incarnation_write_and_names_the_graph_it_refuses(
    manual: tuple[TestClient, MetaLoop], db: Database, actor_conn: Any
) -> None:
    """Kills ``Fenced(None, ...)`` (the worker would drop no graph's actors)."""
    client, loop = manual
    worker = FakeWorker(client).register()
    make_job(db, "j", parallelism=1)
    loop.tick()
    [a] = worker.poll()
    graph, seq, actor = a["graph_id"], a["recovery_seq"], a["actor_id"]
    with actor_conn.cursor() as cur:
        fence(cur, graph, seq, actor)
        with pytest.raises(Fenced) as refused:
            fence(cur, graph, seq - 1, actor)
    assert refused.value.graph_id == graph
