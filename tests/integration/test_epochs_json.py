"""Epochs in the public API's JSON are decimal strings, exact in JavaScript (issue 32).

An epoch is above 2**53; whenever its low 16 bits are not zero (two epochs in one
millisecond, a clock that stalls) a JSON number would reach every JavaScript client
rounded. Here the barrier loop's clock stands still, so every epoch after the first moves
in its low bits, and each answer carrying one is parsed by ``node``'s ``JSON.parse``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.clock import system_clock
from service.db import Database
from service.meta.loop import MetaLoop
from tests.integration.test_events_api import parse_sse
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import create, ins
from tests.kit.meta import FakeWorker, committed_epoch

NODE = shutil.which("node")
# reads [[json_text, path], ...] on stdin, answers the value at each path as JavaScript
# sees it after JSON.parse
NODE_READ = """
const items = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = items.map(([text, path]) => {
  let value = JSON.parse(text);
  for (const key of path) value = value[key];
  return String(value);
});
process.stdout.write(JSON.stringify(out));
"""
Answer = tuple[str, str, list[str | int]]  # (what, the JSON text, where the epoch is)


def _at(data: Any, path: list[str | int]) -> Any:
    for key in path:
        data = data[key]
    return data


def _ok(r: Any) -> str:
    assert r.status_code == 200, r.text
    return str(r.text)


def _answers_with_epochs(client: TestClient, loop: MetaLoop, db: Database) -> list[Answer]:
    """One answer of each kind that carries an epoch, from a job created at a stalled clock."""
    now = system_clock()
    loop.clock = lambda: now  # epochs after the first are now+1, now+2, ... in epoch units
    create(client)
    for _ in range(3):
        loop.tick()
    dml = client.post("/v1/tables/orders/dml", json={"ops": [ins(i) for i in range(5)]})
    loop.tick()
    body = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "arrangement"}
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    worker = FakeWorker(client).register()
    for _ in range(20):
        loop.tick()
        worker.collect_all(finished=True)
        if client.get(f"/v1/jobs/{job}").json()["state"] == "created":
            break
    loop.tick()
    worker.collect_all(finished=True)
    assert client.get(f"/v1/jobs/{job}").json()["state"] == "created"
    ahead = committed_epoch(db) + 1
    not_yet = client.get("/v1/tables/orders/rows", params={"epoch": ahead})
    assert_error(not_yet, 409, "conflict")
    events = parse_sse(_ok(client.get(f"/v1/jobs/{job}/events", params={"follow": "false"})))
    (created,) = [e for e in events if e["event"] == "created"]
    return [
        ("DML", _ok(dml), ["epoch"]),
        ("rows", _ok(client.get("/v1/tables/orders/rows")), ["epoch"]),
        ("job", _ok(client.get(f"/v1/jobs/{job}")), ["committed_epoch"]),
        ("job", _ok(client.get(f"/v1/jobs/{job}")), ["finished_epoch"]),
        ("jobs", _ok(client.get("/v1/jobs")), ["jobs", 0, "committed_epoch"]),
        ("progress", _ok(client.get(f"/v1/jobs/{job}/progress")), ["committed_epoch"]),
        ("verify", _ok(client.get(f"/v1/jobs/{job}/verify")), ["epoch"]),
        ("409", not_yet.text, ["error", "details", "committed_epoch"]),
        ("event created", json.dumps(created["data"]), ["epoch"]),
    ]


def test_every_epoch_in_an_answer_is_a_decimal_string(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    answers = _answers_with_epochs(client, loop, db)
    values = {(what, *path): _at(json.loads(text), path) for what, text, path in answers}
    assert all(isinstance(v, str) and v.isdigit() for v in values.values()), values
    committed = committed_epoch(db)
    assert values["job", "committed_epoch"] == str(committed)
    assert values["409", "error", "details", "committed_epoch"] == str(committed)
    assert values["event created", "epoch"] == values["job", "finished_epoch"]
    # the point of it: these epochs are beyond a double's integer range (2^53), where a
    # JSON number may round (whether this one does depends on its low bits)
    assert committed > 2**53


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_javascript_reads_every_epoch_exactly(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    answers = _answers_with_epochs(client, loop, db)
    assert NODE is not None
    seen_by_node = subprocess.run(
        [NODE, "-e", NODE_READ],
        input=json.dumps([[text, path] for _, text, path in answers]),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    in_python = [str(_at(json.loads(text), path)) for _, text, path in answers]
    labels = [f"{what} {path}" for what, _, path in answers]
    assert dict(zip(labels, json.loads(seen_by_node.stdout), strict=True)) == dict(
        zip(labels, in_python, strict=True)
    )
    assert any(float(int(v)) != int(v) for v in in_python)  # a number would have been rounded


def test_an_epoch_parameter_takes_its_decimal_text_and_nothing_else(
    client: TestClient,
) -> None:
    create(client)
    r = client.post("/v1/tables/orders/dml", params={"wait": "true"}, json={"ops": [ins(1)]})
    assert r.status_code == 200, r.text
    epoch = r.json()["epoch"]
    page = client.get("/v1/tables/orders/rows", params={"epoch": epoch})
    assert _ok(page) and page.json()["epoch"] == epoch
    body = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "arrangement"}
    job = client.post("/v1/jobs", json=body)  # in the main graph: verifiable at once
    verified = client.get(f"/v1/jobs/{job.json()['id']}/verify", params={"epoch": epoch})
    assert _ok(verified) and verified.json()["epoch"] == epoch
    for bad in ("12a", "-1", "1e16", "1.0", " 1", "", "9223372036854775808", "0"):
        for url in ("/v1/tables/orders/rows", f"/v1/jobs/{job.json()['id']}/verify"):
            err = assert_error(client.get(url, params={"epoch": bad}), 422, "validation_error")
            assert [d["loc"] for d in err["details"]] == [["query", "epoch"]], (bad, err)
