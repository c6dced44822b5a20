"""Embedded mode: the control plane starts a local worker process when one is needed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)


# tokens a worker must not hold: it gets its own worker token, or none
OTHER_TOKENS = ("BACKFILL_ADMIN_TOKEN", "BACKFILL_READER_TOKEN", "BACKFILL_WORKER_TOKEN")


class EmbeddedWorkerSpawner:
    def __init__(self, base_url: Callable[[], str | None], token: str | None = None) -> None:
        self._base_url = base_url
        self._token = token
        self.proc: subprocess.Popen[bytes] | None = None

    def ensure(self) -> None:
        """Start the local worker unless it runs already (restart it if it died)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        url = self._base_url()
        if url is None:
            return  # not serving yet
        cmd = [
            sys.executable,
            "-m",
            "service.cli",
            "worker",
            "--control-plane",
            url,
            "--name",
            "embedded",
            # a server killed outright (kill -9, OOM) leaves no orphan polling for it
            "--parent-pid",
            str(os.getpid()),
        ]
        log.info("starting an embedded worker: %s", " ".join(cmd))
        env = {k: v for k, v in os.environ.items() if k.upper() not in OTHER_TOKENS}
        if self._token is not None:
            env["BACKFILL_WORKER_TOKEN"] = self._token
        self.proc = subprocess.Popen(cmd, env=env)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
