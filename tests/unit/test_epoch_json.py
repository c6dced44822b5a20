"""The public API's epoch type: a decimal string in JSON (out), a string or an integer in,
and so in ``openapi.yaml``; the worker protocol keeps integers."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from service.api.epochs import EPOCH_PATTERN, EpochJson, epochs_as_text
from service.api.limits import RequestBody
from service.api.openapi import openapi_document

BIG = 11698412915982339  # JSON.parse in JavaScript reads it as 11698412915982340


class _Body(RequestBody):  # strict, as every request body
    epoch: EpochJson
    since_epoch: EpochJson | None = None


class _Answer(BaseModel):
    epoch: EpochJson
    finished_epoch: EpochJson | None


@pytest.mark.parametrize("given", [str(BIG), BIG])
def test_a_body_takes_an_epoch_as_text_or_as_a_number(given: object) -> None:
    assert _Body.model_validate_json(f'{{"epoch": {json_value(given)}}}').epoch == BIG
    assert _Body.model_validate({"epoch": given}).epoch == BIG


@pytest.mark.parametrize(
    "bad",
    ['"12a"', '"-1"', "-1", '"1e16"', "1e16", "1.5", '"1.0"', '" 1"', '"1\\n"', '""', "true",
     "null", '"9223372036854775808"', "9223372036854775808"],
)  # fmt: skip
def test_anything_else_is_a_validation_error(bad: str) -> None:
    with pytest.raises(ValidationError) as e:
        _Body.model_validate_json(f'{{"epoch": {bad}}}')
    assert [err["loc"] for err in e.value.errors()] == [("epoch",)]


def test_an_answer_carries_epochs_as_decimal_strings_and_python_keeps_integers() -> None:
    answer = _Answer(epoch=BIG, finished_epoch=None)
    assert answer.model_dump_json() == f'{{"epoch":"{BIG}","finished_epoch":null}}'
    assert answer.model_dump(mode="json") == {"epoch": str(BIG), "finished_epoch": None}
    assert answer.model_dump() == {"epoch": BIG, "finished_epoch": None}


def test_free_form_epochs_by_their_names() -> None:
    data = {"epoch": BIG, "snapshot_epoch": 7, "lag_epochs": 3, "phase": "x", "flag_epoch": True}
    assert epochs_as_text(data) == {
        "epoch": str(BIG),
        "snapshot_epoch": "7",
        "lag_epochs": 3,  # a count of epochs, not one
        "phase": "x",
        "flag_epoch": True,
    }


def json_value(v: object) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def _epoch_properties(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every property or query parameter named like an epoch, by where it is."""
    found: dict[str, dict[str, Any]] = {}
    for name, schema in doc["components"]["schemas"].items():
        for prop, sub in schema.get("properties", {}).items():
            if prop == "epoch" or prop.endswith("_epoch"):
                found[f"{name}.{prop}"] = sub
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for p in op.get("parameters", []):
                if p["name"] == "epoch" or p["name"].endswith("_epoch"):
                    found[f"{method.upper()} {path} ?{p['name']}"] = p["schema"]
    return found


def _worker_schemas(doc: dict[str, Any]) -> set[str]:
    """The schemas reachable from the worker protocol's routes (and from no other)."""

    def refs(node: Any) -> set[str]:
        if isinstance(node, dict):
            own = {node["$ref"].rsplit("/", 1)[1]} if "$ref" in node else set()
            return own.union(*(refs(v) for v in node.values()))
        if isinstance(node, list):
            return set().union(*(refs(v) for v in node))
        return set()

    def closure(roots: set[str]) -> set[str]:
        todo, seen = set(roots), set()
        while todo:
            name = todo.pop()
            seen.add(name)
            todo |= refs(doc["components"]["schemas"][name]) - seen
        return seen

    worker = {p for p in doc["paths"] if p == "/v1/workers" or p.startswith("/v1/workers/")}
    public = closure(refs({p: v for p, v in doc["paths"].items() if p not in worker}))
    return closure(refs({p: doc["paths"][p] for p in worker})) - public


def _is_text_epoch(schema: dict[str, Any]) -> bool:
    options = schema.get("anyOf", [schema])
    texts = [o for o in options if o.get("type") == "string"]
    return (
        bool(texts)
        and all(o.get("pattern") == EPOCH_PATTERN for o in texts)
        and all(o.get("type") in ("string", "null") for o in options)
    )


def test_openapi_publishes_every_public_epoch_as_a_decimal_string() -> None:
    doc = openapi_document()
    worker = _worker_schemas(doc)
    found = _epoch_properties(doc)
    public = {k: v for k, v in found.items() if k.split(".")[0] not in worker}
    assert {k for k, v in public.items() if not _is_text_epoch(v)} == set()
    # the ones this issue is about, so that a renamed field cannot hide from the check
    assert {
        "DmlResult.epoch",
        "RowsPage.epoch",
        "JobView.committed_epoch",
        "JobView.finished_epoch",
        "JobView.snapshot_epoch",
        "Progress.committed_epoch",
        "Progress.snapshot_epoch",
        "Verification.epoch",
        "GET /v1/tables/{name}/rows ?epoch",
        "GET /v1/jobs/{job_id}/verify ?epoch",
    } <= set(public)
    # the worker protocol (Python at both ends) keeps JSON integers
    internal = {k: v for k, v in found.items() if k.split(".")[0] in worker}
    assert internal and all(not _is_text_epoch(v) for v in internal.values())
