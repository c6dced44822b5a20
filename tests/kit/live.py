"""A real uvicorn server on loopback, in a thread, for protocol tests and benches."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from service.api.app import create_app
from service.db import Database
from service.settings import Settings


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
