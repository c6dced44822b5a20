"""The default kind's figures (``bench_default_kind.py``) in a deployment's shape: the
worker's Spark on a standalone cluster (``spark://``: a master and a worker of 2 cores
started from the pyspark installation with ``spark-class``, whose executors run a Python
without this project: the worker ships its code), and the control plane, the worker and
the baseline on a Postgres over TCP rather than the embedded one
(``BENCH_TCP_DATABASE_URL``, default ``postgresql://postgres@127.0.0.1:5432/postgres``;
the bench makes a database of its own there and drops it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import psycopg2

from bench.bench_default_kind import figures
from tests.kit.spark_cluster import cluster_python, standalone_cluster

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def run(quick: bool) -> list[dict[str, Any]]:
    server = os.environ.get("BENCH_TCP_DATABASE_URL", DEFAULT_SERVER)
    try:
        psycopg2.connect(server, connect_timeout=5).close()
    except psycopg2.OperationalError as e:
        raise RuntimeError(
            f"no Postgres answers at {server} (set BENCH_TCP_DATABASE_URL): {e}"
        ) from None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        python = cluster_python(root / "venv")
        (root / "cluster").mkdir()
        with standalone_cluster(root / "cluster", cores=2) as master:
            env = {
                "BACKFILL_SPARK_MASTER": master,
                "PYSPARK_PYTHON": python,
                "SPARK_LOCAL_IP": "127.0.0.1",
            }
            results = figures(
                quick, server, env, f"Spark standalone ({master}, 2 cores), Postgres over TCP"
            )
    return [r | {"name": r["name"] + " (standalone cluster, Postgres over TCP)"} for r in results]
