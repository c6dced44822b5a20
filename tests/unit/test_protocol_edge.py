"""The control plane's HTTP edge of the worker protocol: its pydantic models are the
protocol's types with bounds, and a request that is not the protocol's is refused there
with a 422 (``validation_error``), before the meta sees anything."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError

from backfill_core import protocol
from backfill_core.protocol import MalformedMessage
from service.api import workers as edge
from service.api.bodies import parse_body


def test_each_edge_model_has_its_protocol_types_fields() -> None:
    """One definition: an edge model adds bounds and documentation, never a field."""
    for model, core in edge.EDGE_MODELS.items():
        fields = {f.name for f in dataclasses.fields(core)}
        assert set(model.model_fields) == fields, model.__name__


COLLECT = {"actor_id": 1, "recovery_seq": 0, "prev_epoch": 1, "curr_epoch": 2}


def _collect(body: dict[str, Any]) -> protocol.CollectRequest:
    return edge._decoded(parse_body(edge.CollectRequest, json.dumps(body).encode()), ())


def test_a_collect_is_decoded_into_the_protocols_type_once() -> None:
    progress = {"vnodes": [{"vnode": 3, "state": "in_progress", "current_pos": [9]}]}
    got = _collect(COLLECT | {"progress": progress | {"phase": "snapshot"}, "rows": 4})
    assert got == protocol.CollectRequest(
        1,
        0,
        1,
        2,
        protocol.CollectProgress.of(
            vnodes=(protocol.VnodeRestore(3, "in_progress", [9]),), report={"phase": "snapshot"}
        ),
        4,
    )


@pytest.mark.parametrize(
    "body",
    [
        COLLECT | {"unknown": 1},  # unknown member
        COLLECT | {"actor_id": "1"},  # a number as text
        COLLECT | {"finished": 1},  # a number for a boolean
        {k: v for k, v in COLLECT.items() if k != "curr_epoch"},  # missing
        COLLECT | {"progress": {"vnodes": "all"}},
        COLLECT | {"progress": {"vnodes": [{"vnode": "3", "state": "done"}]}},
        COLLECT | {"progress": {"vnodes": [{"vnode": 3}]}},
        COLLECT | {"progress": {"splits": [{"split": 0, "state": "done"}]}},
        COLLECT | {"progress": {"splits": [{"split": "0", "state": "x", "offset": True}]}},
        COLLECT | {"progress": [1]},
    ],
)
def test_a_collect_that_is_not_the_protocols_is_refused_at_the_edge(body: Any) -> None:
    with pytest.raises(RequestValidationError) as e:
        _collect(body)
    [error] = e.value.errors()
    assert error["loc"][0] == "body"


def test_the_cores_decoders_name_what_is_wrong() -> None:
    with pytest.raises(MalformedMessage, match="row_count is not an integer"):
        protocol.VnodeRestore.from_json({"vnode": 1, "state": "s", "row_count": 1.5})
    with pytest.raises(MalformedMessage, match="collects is missing"):
        protocol.CollectBatch.from_json({})
