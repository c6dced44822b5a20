"""Chaos harness: a scenario (``chaos_plan``) run against real processes, then proven.

The control plane and the workers are separate ``backfill`` processes, so faults are real
(``SIGKILL``); Postgres is restarted in immediate mode (a crash and its recovery) when the
harness owns the server. After the faults, every job must reach ``created`` and its view
must equal the view of its upstream at several committed epochs while writes go on, and
once more after they stop (for sources: every offset the source reached, exactly once).

Long runs: ``python -m tests.kit.chaos --minutes 30`` (``--help``); a failure prints the
seed, and ``--seed N`` replays it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg2
from sqlalchemy.engine import make_url

from backfill_core.schema import ColumnType
from backfill_core.vnode import even_split, vnode_hasher
from service.embedded_pg import EmbeddedPostgres, to_libpq_url
from tests.kit.chaos_plan import Fault, Scenario, draw
from tests.kit.e2e import wait_for
from tests.kit.kafka import MOCK_PARTITIONS, MockKafka, Producer, mock_kafka
from tests.kit.live import free_port

TABLE, SOURCE = "chaos_up", "chaos_source"
ADMIN_TOKEN, WORKER_TOKEN = "chaos-admin-token", "chaos-worker-token"
BACKFILL = str(Path(sys.executable).parent / "backfill")
DEADLINE_S = 240.0


@dataclass
class Outcome:
    seed: int
    faults: list[str] = field(default_factory=list)
    checks: int = 0  # verify calls that compared a whole view and found it equal
    mixed_rescales: int = 0  # rescales dealing an actor completed and unfinished vnodes
    seconds: float = 0.0


class ChaosFailure(AssertionError):
    outcome: Outcome | None = None  # what the run did before it failed


class Processes:
    """The control plane and the workers as child processes, logging to ``workdir``."""

    def __init__(self, scenario: Scenario, database_url: str, workdir: Path) -> None:
        self.scenario, self.workdir = scenario, workdir
        self.port = free_port()  # one port for every incarnation of the control plane
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = os.environ | {
            "BACKFILL_DATABASE_URL": database_url,
            "BACKFILL_BARRIER_INTERVAL_MS": str(scenario.barrier_interval_ms),
            "BACKFILL_CHECKPOINT_FREQUENCY": str(scenario.checkpoint_frequency),
            "BACKFILL_SPAWN_EMBEDDED_WORKER": "false",
            "BACKFILL_WORKER_LEASE_MS": "3000",
            "BACKFILL_GC_RETENTION_MS": "0",
            "BACKFILL_SPARK_MIN_ROWS": str(scenario.spark_min_rows),
            "BACKFILL_PUSHDOWN": "true" if scenario.pushdown else "false",
            "BACKFILL_SPARK_MASTER": "local[1]",
            "BACKFILL_ADMIN_TOKEN": ADMIN_TOKEN,
            "BACKFILL_WORKER_TOKEN": WORKER_TOKEN,
            "BACKFILL_LOG_LEVEL": "warning",
        }
        self.control_plane: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        return subprocess.Popen([BACKFILL, *args], env=self.env, stdout=log, stderr=log)

    def start_control_plane(self) -> None:
        self.control_plane = self._spawn("control-plane", ["serve", "--port", str(self.port)])

        def ready() -> bool:
            assert self.control_plane is not None
            if self.control_plane.poll() is not None:
                raise ChaosFailure(f"the control plane exited: {self.tail('control-plane')}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=60, what="control plane ready")

    def kill_control_plane(self) -> None:
        assert self.control_plane is not None
        self.control_plane.send_signal(signal.SIGKILL)
        self.control_plane.wait(timeout=30)

    def start_worker(self) -> None:
        self.started += 1
        name = f"worker-{self.started}"
        self.workers.append(
            self._spawn(name, ["worker", "--control-plane", self.url, "--name", name])
        )

    def kill_worker(self, index: int) -> None:
        victim = self.workers.pop(index % len(self.workers))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        self.start_worker()

    def close(self) -> None:
        for p in [*self.workers, self.control_plane]:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in [*self.workers, self.control_plane]:
            if p is not None:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _value(rng: random.Random, type_: str) -> Any:
    if rng.random() < 0.1:
        return None
    if type_ == "int":
        return rng.randrange(-(2**31), 2**31)
    if type_ == "bigint":
        return rng.randrange(-(2**62), 2**62)
    if type_ == "double":
        return rng.choice((0.0, -1.5, 1e-300, 123456.789, rng.uniform(-1e9, 1e9)))
    if type_ == "text":
        return rng.choice(("", "'; DROP TABLE x; --", "zürich ☃", "a" * rng.randrange(1, 300)))
    if type_ == "boolean":
        return rng.random() < 0.5
    if type_ == "date":
        return f"20{rng.randrange(10, 40)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    return {"k": rng.randrange(10), "v": [rng.random() < 0.5, "x"]}  # jsonb


HEAVY_VNODES = range(8)  # a skewed table's rows mostly live here, in the first actor's


def skewed_keys(rows: int) -> list[int]:
    """``rows`` keys, nine in ten of them hashing to ``HEAVY_VNODES`` of 256."""
    vnode_of = vnode_hasher([ColumnType.BIGINT], 256)
    heavy, light = [], []
    k = 0
    while len(heavy) < rows - rows // 10 or len(light) < rows // 10:
        (heavy if vnode_of((k,)) in HEAVY_VNODES else light).append(k)
        k += 1
    return sorted(heavy[: rows - rows // 10] + light[: rows // 10])


class Writer:
    """The scenario's DML workload, until stopped; ``paused()`` holds it during restarts."""

    def __init__(self, http: httpx.Client, scenario: Scenario) -> None:
        self.http, self.w = http, scenario.workload
        self.rng = random.Random(scenario.seed * 7919 + 1)
        # live keys, in insertion order
        self.keys = skewed_keys(self.w.rows) if self.w.skewed else list(range(self.w.rows))
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.next_key = max(self.keys, default=-1) + 1
        self.stop = threading.Event()
        self.running = threading.Event()
        self.running.set()
        self.lock = threading.Lock()
        self.batches = 0
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def row(self, key: int) -> dict[str, Any]:
        r = {"id": key, "amount": self.rng.randrange(-1000, 1000)}
        return r | {n: _value(self.rng, t) for n, t in self.w.extra_columns}

    def _pick(self, touched: set[int]) -> int | None:
        if not self.keys:
            return None
        hot = max(1, len(self.keys) // 100)
        pool = hot if self.rng.random() < self.w.hot_share else len(self.keys)
        key = self.keys[self.rng.randrange(pool)]
        return None if key in touched else key

    def _drop(self, key: int) -> None:
        i = self.index.pop(key)
        last = self.keys.pop()
        if last != key:
            self.keys[i] = last
            self.index[last] = i

    def batch(self) -> list[dict[str, Any]]:
        ops: list[dict[str, Any]] = []
        touched: set[int] = set()
        for _ in range(self.w.batch):
            op = self.rng.choices(("insert", "update", "delete"), self.w.mix)[0]
            if op == "insert":
                key = self.next_key
                self.next_key += 1
                ops.append({"op": "insert", "row": self.row(key)})
                self.index[key] = len(self.keys)
                self.keys.append(key)
            elif (key_ := self._pick(touched)) is not None:
                key = key_
                if op == "update":
                    ops.append({"op": "update", "row": self.row(key)})
                else:
                    ops.append({"op": "delete", "row": {"id": key}})
                    self._drop(key)
            else:
                continue
            touched.add(key)
        return ops

    def _run(self) -> None:
        while not self.stop.wait(self.w.pause_s):
            if not self.running.wait(timeout=0.1):
                continue
            with self.lock:
                if not self.running.is_set():
                    continue
                ops = self.batch()
                if not ops:
                    continue
                r = self.http.post(f"/v1/tables/{TABLE}/dml", json={"ops": ops})
                if r.status_code != 200:
                    self.error = f"DML answered {r.status_code}: {r.text[:500]}"
                    return
                self.batches += 1

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.running.clear()
        with self.lock:
            pass
        try:
            yield
        finally:
            self.running.set()


def _doc(i: int) -> Any:
    return b"\xff not json" if i % 401 == 0 else {"id": i, "amount": i % 1000, "note": f"m{i}"}


class Run:
    """One scenario against one fresh database."""

    def __init__(
        self,
        scenario: Scenario,
        database_url: str,
        workdir: Path,
        kafka: MockKafka | None,
        restart_postgres: Callable[[], None] | None,
    ) -> None:
        self.s, self.database_url = scenario, database_url
        self.procs = Processes(scenario, database_url, workdir)
        self.kafka, self.restart_postgres = kafka, restart_postgres
        self.outcome = Outcome(scenario.seed)
        self.jobs: list[int] = []
        self.highest: dict[int, int] = collections.defaultdict(int)  # progress rows seen

    # --- helpers ------------------------------------------------------------------
    def committed(self) -> int:
        try:
            conn = psycopg2.connect(to_libpq_url(self.database_url), connect_timeout=5)
        except psycopg2.OperationalError:
            return -1  # Postgres is restarting
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT committed_epoch FROM graphs WHERE id = 1")
                row = cur.fetchone()
                return int(row[0]) if row else -1
        finally:
            conn.close()

    def wait_commits(self, n: int) -> None:
        """``n`` more barrier intervals committed by the main graph (every job's epochs go
        through it). Counted in epoch time, not in commits seen: a worker that is behind
        collects many barriers at once and they commit together."""
        start: list[int] = []
        span = n * self.s.barrier_interval_ms

        def advanced() -> bool:
            c = self.committed()
            if c < 0:
                return False
            if not start:
                start.append(c)
            return (c >> 16) - (start[0] >> 16) >= span

        wait_for(advanced, DEADLINE_S, what=f"{n} barrier intervals committed by the main graph")

    def api(self, http: httpx.Client, method: str, path: str, **kw: Any) -> Any:
        r = http.request(method, path, **kw)
        if r.status_code >= 300:
            raise ChaosFailure(f"{method} {path} answered {r.status_code}: {r.text[:500]}")
        return r.json()

    def check_progress(self, http: httpx.Client) -> None:
        """Committed progress never moves backwards, whatever happened."""
        for job in self.jobs:
            rows = int(self.api(http, "GET", f"/v1/jobs/{job}/progress")["rows"])
            if rows < self.highest[job]:
                raise ChaosFailure(f"job {job}: progress went back {self.highest[job]} -> {rows}")
            self.highest[job] = rows

    def key_history(self, job: int, keys: list[Any]) -> str:
        """What an inexact view's keys went through, for the failure's report: every
        version of them in the upstream and in the view, the graph's committed epoch and
        recovery count, and the job's events (its recoveries among them)."""
        out: list[str] = []
        try:
            conn = psycopg2.connect(to_libpq_url(self.database_url), connect_timeout=5)
        except psycopg2.Error as e:
            return f"(no key history: {e})"
        try:
            with conn.cursor() as cur:
                for side in ("upstream_relation_id", "mv_relation_id"):
                    # the column names are this module's constants, not input
                    cur.execute(
                        f"SELECT r.storage_table FROM jobs j JOIN relations r ON r.id = j.{side} "
                        "WHERE j.id = %s",
                        [job],
                    )
                    row = cur.fetchone()
                    if row is None or not keys:
                        continue
                    cur.execute(
                        f'SELECT * FROM store."{row[0]}" WHERE id = ANY(%s) ORDER BY id, _epoch',
                        [keys],
                    )
                    names = [d[0] for d in cur.description]
                    out.append(f"{side} {row[0]} ({', '.join(names)}):")
                    out += [f"  {r}" for r in cur.fetchall()]
                cur.execute("SELECT committed_epoch, current_epoch, recovery_seq FROM graphs")
                out.append(f"graphs (committed, current, recovery_seq): {cur.fetchall()}")
                cur.execute(
                    "SELECT id, kind, data, created_at FROM events WHERE job_id = %s ORDER BY id",
                    [job],
                )
                out += [f"  event {r}" for r in cur.fetchall()]
        except psycopg2.Error as e:
            out.append(f"(key history cut short: {e})")
        finally:
            conn.close()
        return "\n".join(out)

    def verify(self, http: httpx.Client, job: int, epochs: int) -> None:
        seen: set[int] = set()

        def equal_at_more_epochs() -> bool:
            v = self.api(http, "GET", f"/v1/jobs/{job}/verify")
            if not v["equal"]:
                keys = sorted({r["id"] for r in v["missing"] + v["unexpected"] if "id" in r})
                raise ChaosFailure(
                    f"job {job} is not exact at epoch {v['epoch']}: {v}\n"
                    + self.key_history(job, keys)
                )
            self.outcome.checks += 1
            seen.add(int(v["epoch"]))
            return len(seen) >= epochs

        wait_for(
            equal_at_more_epochs, DEADLINE_S, what=f"job {job} exact at {epochs} committed epochs"
        )

    # --- the run ------------------------------------------------------------------
    def setup(self, http: httpx.Client, writer: Writer) -> Producer | None:
        w = self.s.workload
        columns = [{"name": "id", "type": "bigint"}, {"name": "amount", "type": "int"}]
        columns += [{"name": n, "type": t} for n, t in w.extra_columns]
        body = {"name": TABLE, "columns": columns, "primary_key": ["id"]}
        self.api(http, "POST", "/v1/tables", json=body)
        for lo in range(0, w.rows, 2_000):
            ops = [{"op": "insert", "row": writer.row(k)} for k in writer.keys[lo : lo + 2_000]]
            self.api(http, "POST", f"/v1/tables/{TABLE}/dml", json={"ops": ops})
        if not w.messages:
            return None
        assert self.kafka is not None, "the scenario needs Kafka"
        topic = f"chaos_{self.s.seed}_{uuid.uuid4().hex[:8]}"  # the mock cannot delete topics
        producer = Producer(self.kafka, topic, _doc, w.messages, self.s.seed, most=40)
        self.kafka.load(topic, [(i % MOCK_PARTITIONS, _doc(i)) for i in range(w.messages)])
        source = {
            "name": SOURCE,
            "kafka": {"bootstrap_servers": self.kafka.bootstrap, "topic": topic},
            "columns": [
                {"name": "id", "type": "bigint"},
                {"name": "amount", "type": "int"},
                {"name": "note", "type": "text"},
            ],
        }
        self.api(http, "POST", "/v1/sources", json=source)
        return producer

    def inject(self, http: httpx.Client, writer: Writer, fault: Fault) -> None:
        job = self.jobs[fault.job % len(self.jobs)]
        kind = fault.kind
        if kind == "kill_worker":
            self.procs.kill_worker(fault.job)
        elif kind == "restart_control_plane":
            with writer.paused():
                self.procs.kill_control_plane()
                self.procs.start_control_plane()
        elif kind == "restart_postgres":
            assert self.restart_postgres is not None
            with writer.paused():
                self.restart_postgres()
        elif kind == "pause_resume":
            self.api(http, "POST", f"/v1/jobs/{job}/pause")
            self.wait_commits(3)
            self.api(http, "POST", f"/v1/jobs/{job}/resume")
        elif kind == "throttle":
            self.api(http, "PATCH", f"/v1/jobs/{job}", json={"rate_limit": fault.value})
        elif kind == "rescale":
            plan = self.s.jobs[fault.job % len(self.jobs)]
            assert fault.value is not None
            most = MOCK_PARTITIONS if plan.kind == "source" else 256
            parallelism = min(fault.value, most)
            if plan.kind != "source" and self.merges_finished_and_unfinished(
                http, job, parallelism
            ):
                self.outcome.mixed_rescales += 1
            self.api(http, "PATCH", f"/v1/jobs/{job}", json={"parallelism": parallelism})
        else:
            raise AssertionError(kind)
        self.outcome.faults.append(kind)

    def merges_finished_and_unfinished(
        self, http: httpx.Client, job: int, parallelism: int
    ) -> bool:
        """Whether a rescale of ``job`` to ``parallelism`` now deals some actor completed
        vnodes next to unfinished ones (as committed before it: a lower bound)."""
        progress = self.api(http, "GET", f"/v1/jobs/{job}/progress")
        if progress["state"] != "creating":
            return False
        done = ("completed", "consumed")
        completed = {v["vnode"] for v in progress["vnodes"] if v["state"] in done}
        return any(
            0 < len(completed & set(share)) < len(share) for share in even_split(256, parallelism)
        )

    def run(self) -> Outcome:
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        self.procs.start_control_plane()
        producer: Producer | None = None
        with httpx.Client(base_url=self.procs.url, timeout=60, headers=headers) as http:
            writer = Writer(http, self.s)
            try:
                producer = self.setup(http, writer)
                for _ in range(self.s.workers):
                    self.procs.start_worker()
                writer.thread.start()
                if producer is not None:
                    producer.thread.start()
                # a snapshot job needs a committed upstream epoch (409 until then, "retry
                # in a moment"): the first one, as a client that read the answer would
                wait_for(lambda: self.committed() > 0, DEADLINE_S, what="a first commit")
                for plan in self.s.jobs:
                    body = plan.body(TABLE, SOURCE)
                    self.jobs.append(int(self.api(http, "POST", "/v1/jobs", json=body)["id"]))
                # created before a worker registered, a job's actors wait for one: the
                # faults' commits count from when they run
                for job in self.jobs:
                    wait_for(
                        lambda job=job: (
                            not self.api(http, "GET", f"/v1/jobs/{job}")["waiting_for_worker"]
                        ),
                        DEADLINE_S,
                        what=f"job {job} placed on a worker",
                    )
                for fault in self.s.faults:
                    self.wait_commits(fault.after_commits)
                    self.check_progress(http)
                    self.inject(http, writer, fault)
                    self.check_progress(http)
                    if writer.error:
                        raise ChaosFailure(writer.error)
                for job in self.jobs:  # let every job finish
                    self.api(http, "POST", f"/v1/jobs/{job}/resume")
                    self.api(http, "PATCH", f"/v1/jobs/{job}", json={"rate_limit": None})
                for job in self.jobs:
                    wait_for(
                        lambda job=job: (
                            self.api(http, "GET", f"/v1/jobs/{job}")["state"] == "created"
                        ),
                        DEADLINE_S,
                        what=f"job {job} created",
                    )
                    self.check_progress(http)
                for job in self.jobs:
                    self.verify(http, job, epochs=3)
            finally:
                writer.stop.set()
                if producer is not None:
                    producer.stop.set()
                    producer.thread.join(timeout=30)
                writer.thread.join(timeout=30)
            if writer.error:
                raise ChaosFailure(writer.error)
            for job in self.jobs:  # once more, at rest: the final state of every upstream
                self.verify(http, job, epochs=1)
                progress = self.api(http, "GET", f"/v1/jobs/{job}/progress")
                if progress["percent"] != 100:
                    raise ChaosFailure(f"job {job} is created at {progress['percent']}%")
        self.outcome.seconds = time.monotonic() - started
        return self.outcome


def _where(e: BaseException) -> str:
    """The harness's own frames of ``e``'s traceback: which step failed."""
    frames = traceback.extract_tb(e.__traceback__)
    return " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(frames) if f.filename == __file__)


def _server_sql(server_url: str, statement: str) -> None:
    conn = psycopg2.connect(to_libpq_url(server_url))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


def run_seed(
    seed: int,
    server_url: str,
    workdir: Path,
    kafka: MockKafka | None,
    restart_postgres: Callable[[], None] | None,
) -> Outcome:
    """Draw ``seed``'s scenario and run it in a new database of ``server_url`` (dropped
    afterwards). A failure is a ``ChaosFailure`` naming the seed, the scenario, the way to
    replay it and the tail of each process's log."""
    scenario = draw(seed, kafka=kafka is not None, restart_postgres=restart_postgres is not None)
    name = f"chaos_{seed}_{uuid.uuid4().hex[:8]}"
    _server_sql(server_url, f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    rundir = workdir / name
    rundir.mkdir(parents=True)
    run = Run(scenario, url, rundir, kafka, restart_postgres)
    try:
        return run.run()
    except Exception as e:
        logs = "\n".join(
            f"--- {p.stem} ---\n{run.procs.tail(p.stem)}" for p in sorted(rundir.glob("*.log"))
        )
        failure = ChaosFailure(
            f"chaos run failed: {type(e).__name__}: {e}\n{scenario.describe()}\n"
            f"at: {_where(e)}\n"
            f"faults injected: {run.outcome.faults}\n"
            f"replay: python -m tests.kit.chaos --seed {seed}\n{logs}"
        )
        failure.outcome = run.outcome
        raise failure from e
    finally:
        run.procs.close()
        # a connection of its own: the server may have restarted meanwhile
        _server_sql(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.kit.chaos",
        description="Run chaos scenarios (random workload, jobs, settings and faults per "
        "seed) against real processes and check every view afterwards.",
    )
    parser.add_argument("--seed", type=int, action="append", help="run this seed (repeatable)")
    parser.add_argument("--minutes", type=float, help="long mode: run seeds for this long")
    parser.add_argument("--first-seed", type=int, help="long mode: first seed (default random)")
    parser.add_argument("--no-kafka", action="store_true", help="no source jobs")
    parser.add_argument("--workdir", type=Path, help="logs and the embedded Postgres")
    args = parser.parse_args(argv)
    if not args.seed and args.minutes is None:
        parser.error("give --seed N (replay) or --minutes M (long mode)")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    url, pg = os.environ.get("TEST_DATABASE_URL"), None
    if url is None:  # a server of our own, so it may be restarted
        pg = EmbeddedPostgres(workdir / "pg")
        url = pg.start()
    first = args.first_seed if args.first_seed is not None else random.randrange(10**6)
    seeds = iter(args.seed) if args.seed else itertools.count(first)
    deadline = time.monotonic() + 60 * (args.minutes or 0)
    runs, failed, faults = 0, [], collections.Counter[str]()
    with contextlib.ExitStack() as stack:
        kafka = None if args.no_kafka else stack.enter_context(mock_kafka())
        for seed in seeds:
            if args.minutes is not None and time.monotonic() > deadline:
                break
            runs += 1
            try:
                outcome = run_seed(seed, url, workdir, kafka, pg.restart if pg else None)
                faults.update(outcome.faults)
                print(
                    f"seed {seed}: ok, faults {outcome.faults}, {outcome.mixed_rescales} mixed "
                    f"rescales, {outcome.checks} exact "
                    f"checks, {outcome.seconds:.0f} s",
                    flush=True,
                )
            except ChaosFailure as e:
                faults.update(e.outcome.faults if e.outcome else [])
                failed.append(seed)
                print(f"seed {seed}: FAILED\n{e}", flush=True)
    if pg is not None:
        pg.stop()
    print(f"{runs} run(s), {sum(faults.values())} fault(s) injected {dict(faults)}")
    print(f"{len(failed)} failure(s)" + (f": seeds {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
