"""Embedded mode: the control plane starts a local worker process when one is needed."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)


class EmbeddedWorkerSpawner:
    def __init__(self, base_url: Callable[[], str | None]) -> None:
        self._base_url = base_url
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
        ]
        log.info("starting an embedded worker: %s", " ".join(cmd))
        self.proc = subprocess.Popen(cmd)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
