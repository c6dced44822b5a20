"""HTTP client of the worker protocol (httpx), with timeouts and safe retries.

Every call is safe to retry: register creates a new worker (only retried when the
request provably never reached the server), heartbeats and polls are reads or
refreshes, and collects are idempotent per (actor, epoch) on the server, so a collect
whose response was lost comes back as ``duplicate`` instead of being applied twice.
Every request carries the worker's token (``BACKFILL_WORKER_TOKEN``) when it has one.

The messages are the protocol's types (``backfill_core.protocol``), decoded here once:
the rest of the worker never reads a message's JSON.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from backfill_core.protocol import (
    CollectAnswer,
    CollectBatch,
    CollectBatchAnswer,
    CollectProgress,
    CollectRequest,
    ErrorBody,
    ErrorCode,
    ExportReport,
    ExportReportAnswer,
    ExportTask,
    FailureReport,
    ImportReport,
    ImportReportAnswer,
    ImportState,
    ImportTask,
    PollAnswer,
    RegisterRequest,
    Registration,
)

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {502, 503, 504}


class ProtocolError(Exception):
    """The control plane refused a request. Decoded once, here: the worker branches on
    ``code`` (None: not one of the protocol's codes, such as a validation error or a
    proxy's page), never on the message."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"control plane answered {status}: {body}")
        self.status = status
        self.body = body
        self.error = ErrorBody.from_json(body)
        self.code: ErrorCode | None = self.error.protocol_code
        self.actor_id = self.error.actor_id  # the actor it is about, if any


class WorkerGone(ProtocolError):
    """The control plane declared this worker dead: drop all actors and register again."""


@dataclass
class RetryPolicy:
    attempts: int = 8
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return min(self.max_delay_s, self.base_delay_s * 2**attempt) * (0.5 + rng.random() / 2)


class ControlPlaneClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.http = httpx.Client(
            base_url=base_url, timeout=timeout_s, transport=transport, headers=headers
        )
        self.retry = retry or RetryPolicy()
        self.rng = rng or random.Random()
        self.worker_id: int | None = None

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, url: str, *, idempotent: bool = True, **kw: Any) -> httpx.Response:
        last: Exception | None = None
        for attempt in range(self.retry.attempts):
            try:
                r = self.http.request(method, url, **kw)
            except httpx.ConnectError as e:  # never reached the server: always safe
                last = e
            except httpx.TransportError as e:
                if not idempotent:
                    raise
                last = e
            else:
                if r.status_code not in RETRYABLE_STATUS:
                    return r
                last = ProtocolError(r.status_code, r.text)
            time.sleep(self.retry.delay(attempt, self.rng))
        assert last is not None
        raise last

    @staticmethod
    def _json(r: httpx.Response, ok: int = 200) -> Any:
        if r.status_code != ok:
            try:
                body = r.json()
            except ValueError:
                body = r.text
            error = ProtocolError(r.status_code, body)
            if error.code is ErrorCode.WORKER_GONE:
                raise WorkerGone(r.status_code, body)
            raise error
        return r.json() if r.content else None

    def register(self, name: str, capacity: int) -> Registration:
        body = RegisterRequest(name, capacity).to_json()
        r = self._call("POST", "/v1/workers", idempotent=False, json=body)
        registration = Registration.from_json(self._json(r, 201))
        self.worker_id = registration.worker_id
        return registration

    def heartbeat(self) -> None:
        self._json(self._call("POST", f"/v1/workers/{self.worker_id}/heartbeat"), 204)

    def poll(self, timeout_ms: int = 5000, *, barrier_wanted: bool = False) -> PollAnswer:
        extra = httpx.Timeout(self.http.timeout.read or 10.0)
        wait = max(extra.read or 0.0, timeout_ms / 1000 + 10)
        params: dict[str, Any] = {"timeout_ms": timeout_ms}
        if barrier_wanted:
            params["barrier_wanted"] = "true"
        r = self._call(
            "GET",
            f"/v1/workers/{self.worker_id}/barriers",
            params=params,
            timeout=httpx.Timeout(wait),
        )
        return PollAnswer.from_json(self._json(r))

    def collect(
        self,
        actor_id: int,
        prev_epoch: int,
        curr_epoch: int,
        *,
        recovery_seq: int,
        progress: CollectProgress | None = None,
        rows: int = 0,
        finished: bool = False,
    ) -> CollectAnswer:
        body = CollectRequest(
            actor_id, recovery_seq, prev_epoch, curr_epoch, progress, rows, finished
        ).to_json()
        r = self._call("POST", f"/v1/workers/{self.worker_id}/collect", json=body)
        return CollectAnswer.from_json(self._json(r))

    def collect_many(self, collects: list[CollectRequest]) -> list[CollectAnswer]:
        """Several collects in one request, applied all or nothing (and idempotent)."""
        body = CollectBatch(collects).to_json()
        r = self._call("POST", f"/v1/workers/{self.worker_id}/collects", json=body)
        return CollectBatchAnswer.from_json(self._json(r)).results

    def report_failure(
        self,
        message: str,
        actor_id: int | None = None,
        *,
        cause_actor_id: int | None = None,
        fatal: bool = False,
    ) -> None:
        body = FailureReport(message, actor_id, cause_actor_id, fatal).to_json()
        self._json(self._call("POST", f"/v1/workers/{self.worker_id}/failures", json=body), 202)

    def claim_export(self) -> ExportTask | None:
        """A queued export, now this worker's to run; None when none is queued. Not
        retried once sent: a second claim would take a second export."""
        r = self._call("POST", f"/v1/workers/{self.worker_id}/exports/claim", idempotent=False)
        if r.status_code == 204:
            return None
        return ExportTask.from_json(self._json(r))

    def report_export(self, export_id: int, report: ExportReport) -> ExportReportAnswer:
        url = f"/v1/workers/{self.worker_id}/exports/{export_id}"
        r = self._call("POST", url, json=report.to_json())
        return ExportReportAnswer.from_json(self._json(r))

    def claim_import(self) -> ImportTask | None:
        """A queued import, now this worker's to run; None when none is queued. Not
        retried once sent, as ``claim_export``."""
        r = self._call("POST", f"/v1/workers/{self.worker_id}/imports/claim", idempotent=False)
        if r.status_code == 204:
            return None
        return ImportTask.from_json(self._json(r))

    def report_import(
        self, import_id: int, report: ImportReport, *, publish_timeout_s: float = 600.0
    ) -> ImportReportAnswer:
        """A report on an import; one that its rows are staged is answered once they are
        published (one statement, longer than other calls: ``publish_timeout_s``). A
        retry of it is safe: it finds the import published already."""
        url = f"/v1/workers/{self.worker_id}/imports/{import_id}"
        extra: dict[str, Any] = {}
        if report.state is ImportState.SUCCEEDED:
            extra["timeout"] = publish_timeout_s
        r = self._call("POST", url, json=report.to_json(), **extra)
        return ImportReportAnswer.from_json(self._json(r))

    def deregister(self) -> None:
        self._json(self._call("DELETE", f"/v1/workers/{self.worker_id}"), 204)
