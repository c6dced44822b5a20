"""The CLI as a user runs it: real processes, the embedded Postgres, real HTTP."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.kit.e2e import wait_for

BACKFILL = str(Path(sys.executable).parent / "backfill")


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BACKFILL, *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("serve",),
        ("worker",),
        ("db",),
        ("db", "upgrade"),
        ("db", "downgrade"),
        ("db", "current"),
        ("db", "create-reader-role"),
        ("demo",),
        ("openapi",),
        ("jobs",),
        ("jobs", "watch"),
        ("tables", "list"),
        ("sources", "show"),
        ("workers", "list"),
    ],
)
def test_every_command_has_help(args: tuple[str, ...]) -> None:
    r = run(*args, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage: backfill" in r.stdout


def test_version() -> None:
    from importlib.metadata import version

    r = run("--version")
    assert r.returncode == 0 and r.stdout == f"backfill {version('mv-backfill')}\n"


def test_worker_without_java_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # no java here
    assert shutil.which("java", path=env["PATH"]) is None
    r = run("worker", "--control-plane", "http://127.0.0.1:1", env=env)
    assert r.returncode == 2
    assert "Java 17 is required" in r.stderr


def test_bad_setting_fails_start_up_naming_the_variable(tmp_path: Path) -> None:
    env = dict(os.environ, BACKFILL_BARRIER_INTERVAL_MS="nope")
    r = run("serve", "--data-dir", str(tmp_path), env=env)
    assert r.returncode == 2
    assert "BACKFILL_BARRIER_INTERVAL_MS" in r.stderr


def _embedded_env(tokens: bool = True) -> dict[str, str]:
    """This environment without a database URL (and, with ``tokens=False``, without the
    test tokens: as a user's first ``make demo``)."""
    drop = {"DATABASE_URL", "BACKFILL_DATABASE_URL"}
    if not tokens:
        drop |= {f"BACKFILL_{role.upper()}_TOKEN" for role in ("admin", "reader", "worker")}
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_db_commands_on_the_embedded_default(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    r = run("db", "upgrade", "--data-dir", data, env=_embedded_env())
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "data" / "pgdata" / "PG_VERSION").exists()
    r = run("db", "current", "--data-dir", data, env=_embedded_env())
    assert r.returncode == 0, r.stderr
    current = r.stdout.split("current: ")[1].split()[0]
    assert current != "None" and f"head: {current}" in r.stdout
    r = run("db", "downgrade", "--data-dir", data, env=_embedded_env())
    assert r.returncode == 2 and "required: revision" in r.stderr  # never to empty by default
    r = run("db", "downgrade", "base", "--data-dir", data, env=_embedded_env())
    assert "revision None" in r.stdout


def test_serve_on_the_embedded_default_prints_its_url_and_answers(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [BACKFILL, "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_embedded_env(),
    )
    try:
        deadline = time.monotonic() + 120
        url = None
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if "ready at " in line:
                url = line.rsplit("ready at ", 1)[1].strip()
                break
        assert url, "serve never printed its URL"
        assert httpx.get(f"{url}/readyz", timeout=10).json()["status"] == "ready"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert proc.returncode == 0


@pytest.mark.parametrize("ctrl_c", [False, True], ids=["sigterm", "ctrl_c_to_the_group"])
def test_a_healthy_start_recovers_nothing_and_sigterm_stops_worker_then_server(
    tmp_path: Path, ctrl_c: bool
) -> None:
    """The embedded worker starts with the server, before any job: a job created at once
    after start-up is placed on it (waiting for it to register if need be) instead of
    recovering for want of a worker. SIGTERM (or Ctrl-C in a terminal: SIGINT to the
    whole process group, the worker included) stops that worker first, then the server,
    with no error logged by either and exit code 0."""
    from tests.kit.auth import http_client

    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [BACKFILL, "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
            env=_embedded_env() | {"BACKFILL_SPARK_MODE": "never", "BACKFILL_LOG_FORMAT": "json"},
            start_new_session=ctrl_c,
        )
        try:
            url = _ready_url(proc)
            with http_client(url) as http:
                table = {
                    "name": "t",
                    "columns": [{"name": "id", "type": "bigint"}],
                    "primary_key": ["id"],
                }
                assert http.post("/v1/tables", json=table).status_code == 201
                ops = [{"op": "insert", "row": {"id": i}} for i in range(1_000)]
                assert http.post("/v1/tables/t/dml", json={"ops": ops}).status_code == 200
                for kind in ("arrangement", "snapshot"):
                    body = {"name": f"v_{kind}", "upstream": {"table": "t"}, "backfill": kind}
                    r = http.post("/v1/jobs", json=body | {"background": False}, timeout=300)
                    assert r.status_code == 201, r.text
                    p = http.get(f"/v1/jobs/{r.json()['id']}/progress").json()
                    assert p["recent_recoveries"] == [], p
                    assert (p["rows"], p["total_estimate"]) == (1_000, 1_000), p
        finally:
            if ctrl_c:
                os.killpg(proc.pid, signal.SIGINT)
            else:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert proc.returncode == 0
    text = log.read_text()
    assert "Traceback" not in text and '"level": "error"' not in text, text[-3000:]
    lines = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
    assert any(ln["message"].startswith("starting an embedded worker") for ln in lines)
    # the worker's own lines carry its id
    (registered,) = (ln for ln in lines if ln["message"].startswith("registered as worker"))
    assert registered["message"] == f"registered as worker {registered['worker_id']}"
    assert any(
        ln.get("worker_id") == registered["worker_id"] and ln is not registered for ln in lines
    ), "no other line of the worker carries its id"


def test_the_embedded_worker_of_a_killed_server_stops(tmp_path: Path) -> None:
    """``serve`` killed outright (kill -9, the OOM killer) cannot stop its worker: the
    worker notices that its parent is gone and stops, leaving no orphan behind."""
    import psutil

    proc = subprocess.Popen(
        [BACKFILL, "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_embedded_env() | {"BACKFILL_SPARK_MODE": "never"},
    )
    try:
        _ready_url(proc)
        server = psutil.Process(proc.pid)

        def worker() -> psutil.Process | None:
            kids = [p for p in server.children() if "service.cli worker" in " ".join(p.cmdline())]
            return kids[0] if kids else None

        wait_for(lambda: worker() is not None, timeout=60, what="the embedded worker")
        orphan = worker()
        assert orphan is not None
    finally:
        proc.kill()
        proc.wait(timeout=30)
    try:
        orphan.wait(timeout=60)
    except psutil.TimeoutExpired:
        orphan.kill()
        raise AssertionError("the worker outlived its server") from None
    finally:
        # the embedded Postgres outlives a server killed outright (a restart reuses it)
        data = str(tmp_path / "data")
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] and data in " ".join(p.info["cmdline"]):
                p.kill()


def _ready_url(proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "ready at " in line:
            return line.rsplit("ready at ", 1)[1].strip()
    raise AssertionError("serve never printed its URL")


def test_demo_runs_end_to_end_on_the_embedded_default(tmp_path: Path) -> None:
    """Auth on and no token given: the first start generates an admin token and shows it
    once; the demo uses a token of its own, and the spawned worker one of its own."""
    env = _embedded_env(tokens=False)
    r = run("demo", "--data-dir", str(tmp_path / "data"), env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "read back 19,950 rows" in r.stdout
    assert "materialized view demo_big_orders is created and exact" in r.stdout
    assert r.stderr.count("admin token: ") == 1
