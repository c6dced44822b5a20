"""A Spark standalone cluster on this machine (master and one worker, started with
pyspark's own ``spark-class``) whose executors run a Python without this project: what an
existing cluster looks like to a worker that ships its code (spark_workers/shipped_code.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path

from tests.kit.e2e import wait_for

# what a cluster's Python has: pyspark (with py4j, which it requires), pyarrow, psycopg2
CLUSTER_PACKAGES = ("pyspark", "py4j", "pyarrow", "psycopg2")
# the shared libraries psycopg2-binary's extension loads from beside it
CLUSTER_LIB_DIRS = ("psycopg2_binary.libs",)
START_TIMEOUT_S = 120.0


def _site_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    return Path(next(iter(spec.submodule_search_locations))).parent


def cluster_python(root: Path) -> str:
    """A virtual environment at ``root`` with only ``CLUSTER_PACKAGES``, this environment's
    own (the same versions, no download): linked into a directory its ``.pth`` file names
    rather than installed again, which would copy pyspark's hundreds of MB per run."""
    venv.create(root, with_pip=False)
    python = root / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", "")},
    ).stdout.strip()
    linked = root / "cluster-packages"
    linked.mkdir()
    for name in CLUSTER_PACKAGES:
        (linked / name).symlink_to(_site_dir(name) / name)
    for name in CLUSTER_LIB_DIRS:
        found = _site_dir("psycopg2") / name
        if found.exists():
            (linked / name).symlink_to(found)
    Path(site, "cluster_packages.pth").write_text(f"{linked}\n")
    return str(python)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env() -> dict[str, str]:
    """The environment of the cluster's daemons, hence of its executors: none of ours
    (no PYTHONPATH, no BACKFILL_*), only what Java and Spark need."""
    keep = ("PATH", "HOME", "JAVA_HOME", "LANG", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    # the master and the worker only schedule: C1 code and the serial collector spare
    # the CPU that C2's compiler and G1's threads take (as the driver's, spark_path.py)
    env["SPARK_DAEMON_JAVA_OPTS"] = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    return env


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except (OSError, ValueError):  # ValueError: a starting master served its HTML page
        return 0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # each daemon leads a process group of its own: the worker's executors go with it
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@contextlib.contextmanager
def standalone_cluster(root: Path, cores: int = 1) -> Iterator[str]:
    """A master and one worker (``cores`` cores, 1 GB); yields the master's URL."""
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    port, ui_port = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    env = spark_env()
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        log = open(root / f"{name}.log", "wb")  # noqa: SIM115 - the daemon writes to it
        procs.append(
            subprocess.Popen(
                [str(spark_class), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=root,
                start_new_session=True,
            )
        )
        log.close()

    try:
        start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)),
        )
        (root / "work").mkdir()
        start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            master_url,
            *("--cores", str(cores), "--memory", "1g", "--work-dir", str(root / "work")),
            *("--host", "127.0.0.1", "--webui-port", str(free_port())),
        )
        try:
            wait_for(lambda: _alive_workers(ui_port) == 1, START_TIMEOUT_S, "a Spark worker")
        except AssertionError:
            logs = {p.name: p.read_text(errors="replace")[-2000:] for p in root.glob("*.log")}
            raise AssertionError(f"the standalone cluster did not start: {logs}") from None
        yield master_url
    finally:
        for proc in reversed(procs):
            _stop(proc)


def executor_stderr(root: Path) -> str:
    """The executors' logs (for a failure's message)."""
    parts = [p.read_text(errors="replace")[-3000:] for p in (root / "work").rglob("stderr")]
    return "\n".join(parts) or "(no executor logs)"


def python_lacks_project(python: str) -> bool:
    ours = ("backfill_core", "spark_workers", "state_store", "connectors", "service")
    code = f"import importlib.util as u; print(any(u.find_spec(p) for p in {ours!r}))"
    out = subprocess.run(
        [python, "-c", code], check=True, capture_output=True, text=True, env=spark_env(), cwd="/"
    ).stdout.strip()
    return out == "False"
