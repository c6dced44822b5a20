"""The document's ``Filter``: the shape of a job's filter, as JSON schema.

The service checks a filter's shape with ``backfill_core.view.check_filter_shape`` (its
errors name the node: ``filter.and[1].op``); these models are that shape written for the
OpenAPI document only, so that a generated client validates a filter as the service does
(``tests/integration/test_generated_client.py`` holds the two to agreeing). What the
schema cannot say: at most ``MAX_DEPTH`` levels and ``MAX_NODES`` nodes, columns of the
upstream, values of their types; those are checked when the job is created.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema

from backfill_core.view import COMPARE_OPS, MAX_DEPTH, MAX_NODES
from service.api.rules import ColumnRef

_NODE = ConfigDict(extra="forbid", populate_by_name=True)
NotNull = Annotated[
    Any,
    WithJsonSchema(
        {
            # not `{"not": {"type": "null"}}`: a negation costs a generator dearly
            "type": ["string", "number", "boolean", "array", "object"],
            "description": "a value of the column's type; no text may hold the NUL character "
            "or a lone surrogate",
        }
    ),
]


class FilterAnd(BaseModel):
    """True when every part is."""

    model_config = _NODE
    and_: list[Filter] = Field(alias="and", min_length=1)


class FilterOr(BaseModel):
    """True when a part is."""

    model_config = _NODE
    or_: list[Filter] = Field(alias="or", min_length=1)


class FilterNot(BaseModel):
    model_config = _NODE
    not_: Filter = Field(alias="not")


class FilterCompare(BaseModel):
    """A column compared with a value of its type (as in a DML row): never true when the column is null; a jsonb column takes `=` and `!=` only."""  # noqa: E501

    model_config = _NODE
    col: ColumnRef
    op: Literal[COMPARE_OPS]  # type: ignore[valid-type]
    value: NotNull


class FilterIn(BaseModel):
    """The column's value is one of these."""

    model_config = _NODE
    col: ColumnRef
    op: Literal["in"]
    value: list[NotNull] = Field(min_length=1)


class FilterIsNull(BaseModel):
    model_config = _NODE
    col: ColumnRef
    op: Literal["is_null"]


Filter = FilterAnd | FilterOr | FilterNot | FilterCompare | FilterIn | FilterIsNull


def filter_components() -> dict[str, Any]:
    """``Filter`` and its nodes, as component schemas of the document."""
    schema = TypeAdapter(Filter).json_schema(ref_template="#/components/schemas/{model}")
    schema["description"] = (
        "A JSON expression tree over the upstream's columns, at most "
        f"{MAX_DEPTH} levels deep and {MAX_NODES} nodes (docs/api.md#jobs)"
    )
    nodes = schema.pop("$defs")
    for node in nodes.values():  # a part is a `Filter` (pydantic spells the union out)
        for prop in node["properties"].values():
            inner = prop.get("items", prop)
            if inner.get("anyOf") == schema["anyOf"]:
                del inner["anyOf"]
                inner["$ref"] = "#/components/schemas/Filter"
    return {**nodes, "Filter": schema}
