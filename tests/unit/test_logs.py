"""Logging by convention (issue 34): one level for every logger, JSON lines on request,
the ids of the context on every line, bad settings refused."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service import logs
from spark_workers.log_ids import forget_log_labels


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    forget_log_labels()  # a worker runtime of an earlier test labelled the process
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    yield out
    root.handlers[:] = before[0]
    root.setLevel(before[1])


def test_one_level_for_every_logger_uvicorn_included(stream: io.StringIO) -> None:
    logs.configure_logging("warning", "text", stream)
    logging.getLogger("uvicorn.error").info("hidden")
    logging.getLogger("service.meta.loop").info("hidden too")
    logging.getLogger("uvicorn.access").warning("shown")
    assert stream.getvalue().count("\n") == 1 and "shown" in stream.getvalue()
    logs.configure_logging("debug", "text", stream)
    logging.getLogger("uvicorn.error").debug("now shown")
    assert "now shown" in stream.getvalue()


def test_json_lines_carry_the_context_ids(stream: io.StringIO) -> None:
    logs.configure_logging("info", "json", stream)
    log = logging.getLogger("service.test")
    with logs.log_context(request_id="r1", job_id=7):
        log.info("steered %s", "x")
        with logs.log_context(actor_id=3):
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                log.exception("failed")
    log.info("outside")
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "steered x" and first["level"] == "info"
    assert (first["request_id"], first["job_id"], first["logger"]) == ("r1", 7, "service.test")
    assert second["actor_id"] == 3 and "RuntimeError: boom" in second["exception"]
    assert "request_id" not in third


def test_text_lines_append_the_ids(stream: io.StringIO) -> None:
    logs.configure_logging("info", "text", stream)
    with logs.log_context(worker_id=2):
        logging.getLogger("x").info("hello")
    assert stream.getvalue().rstrip().endswith("x: hello [worker_id=2]")


@pytest.mark.parametrize(
    ("level", "fmt", "name"), [("loud", "text", "LEVEL"), ("info", "xml", "FORMAT")]
)
def test_bad_settings_name_their_variable(level: str, fmt: str, name: str) -> None:
    with pytest.raises(logs.LogSettingsError, match=f"BACKFILL_LOG_{name}"):
        logs.configure_logging(level, fmt)


def test_a_request_has_an_id_on_its_answer_and_its_lines(stream: io.StringIO) -> None:
    from fastapi import FastAPI

    from service.api.request_ids import RequestIds

    app = FastAPI()
    app.add_middleware(RequestIds)

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: int) -> dict[str, int]:
        logging.getLogger("service.api.jobs").warning("looked at")
        return {"id": job_id}

    logs.configure_logging("info", "json", stream)
    with TestClient(app) as client:
        given = client.get("/v1/jobs/42", headers={"X-Request-ID": "abc-123"})
        made = client.get("/v1/jobs/43", headers={"X-Request-ID": "no spaces allowed"})
    assert given.headers["x-request-id"] == "abc-123"
    assert made.headers["x-request-id"] not in ("", "no spaces allowed")
    lines = [json.loads(x) for x in stream.getvalue().splitlines() if "looked at" in x]
    assert [(x["request_id"], x["job_id"]) for x in lines] == [
        ("abc-123", 42),
        (made.headers["x-request-id"], 43),
    ]
