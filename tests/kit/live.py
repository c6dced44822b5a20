"""A real uvicorn server on loopback, in a thread (protocol tests) or in a child
process (benches)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from service.api.app import create_app
from service.db import Database
from service.settings import Settings


def free_port() -> int:
    """A loopback port nothing listens on now (for a server that restarts on it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def live_server(settings: Settings, db: Database | None = None, port: int = 0) -> Iterator[str]:
    """``port`` 0 picks a free one; give the same one again to restart "the" control plane."""
    app = create_app(settings, db)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class RestartableServer:
    """``live_server`` on a port of its own, so that ``restart`` brings "the" control
    plane back at the same address (clients and workers keep their URL)."""

    def __init__(self, settings: Settings, db: Database | None = None) -> None:
        self.settings, self.db, self.port = settings, db, free_port()
        self._server: Any = None
        self.url = ""

    def __enter__(self) -> RestartableServer:
        self._server = live_server(self.settings, self.db, self.port)
        self.url = self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(None, None, None)

    def restart(self) -> None:
        url = self.url
        self.__exit__()
        self.__enter__()
        assert self.url == url, (self.url, url)


BACKFILL = str(Path(sys.executable).with_name("backfill"))


@contextmanager
def child_process(
    args: list[str], ready: Callable[[], bool], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``backfill <args>`` as a child process, once ``ready()``; terminated at the end.
    If it exits or is not ready within 60 s, the error carries the tail of its output."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([BACKFILL, *args], env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while not ready():
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-3000:]
                    raise RuntimeError(f"backfill {args[0]} did not start:\n{tail}")
                time.sleep(0.05)
            yield proc
        finally:
            stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL if it has not exited a minute later."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def worker_processes(
    url: str, env: dict[str, str] | None = None
) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Start ``backfill worker`` processes named as asked (for tests that kill -9 one
    and start its heir), with ``env`` if given; those still running at the end are
    terminated."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        started.append(
            subprocess.Popen([BACKFILL, "worker", "--control-plane", url, "--name", name], env=env)
        )
        return started[-1]

    try:
        yield start
    finally:
        for proc in reversed(started):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)


@contextmanager
def server_process(database_url: str, **settings: Any) -> Iterator[str]:
    """``backfill serve`` as a child process (its own interpreter, as in production):
    for benches, where a server sharing the load generator's GIL measures the harness.
    ``settings`` become ``BACKFILL_*`` variables; the test tokens come from the
    environment (``use_test_tokens``)."""
    port = free_port()
    env = os.environ | {
        "BACKFILL_DATABASE_URL": database_url,
        "BACKFILL_SPAWN_EMBEDDED_WORKER": "false",
        "BACKFILL_LOG_LEVEL": "warning",
    }
    env |= {
        f"BACKFILL_{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in settings.items()
    }
    base = f"http://127.0.0.1:{port}"
    with child_process(["serve", "--port", str(port)], lambda: _ready(base), env):
        yield base


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
