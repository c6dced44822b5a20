"""A job's filter in a request: its shape, as pydantic models the document publishes.

The models check what a generated client can check too (each node an object of the
right keys, a column that can be a name); ``backfill_core.view.check_filter_shape`` then
checks the rest of what needs no schema (the ops, non-empty lists, a value where one is
wanted), answered as the service's ``invalid`` naming the node (``filter.and[1].op``).
Columns of the upstream and values of their types are checked when the job is created.
The ops are a string, not an enum, in the document: a wrong op is an ``invalid`` naming
it, which a schema violation (a ``validation_error``) could not be.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from backfill_core.schema import SchemaError
from backfill_core.view import COMPARE_OPS, MAX_DEPTH, MAX_NODES, check_filter_shape
from service.api.rules import ColumnRef, rule_error

_NODE = ConfigDict(extra="forbid", strict=True)


class FilterAnd(BaseModel):
    """True when every part is (at least one)."""

    model_config = _NODE
    and_: list[Filter] = Field(alias="and")


class FilterOr(BaseModel):
    """True when a part is (at least one)."""

    model_config = _NODE
    or_: list[Filter] = Field(alias="or")


class FilterNot(BaseModel):
    model_config = _NODE
    not_: Filter = Field(alias="not")


class FilterLeaf(BaseModel):
    """A column compared with a value of its type (never true when the column is null; a jsonb column takes `=` and `!=` only), `in` a non-empty list of values, or `is_null` (no value)."""  # noqa: E501

    model_config = _NODE
    col: ColumnRef
    op: str = Field(
        description=f"one of {' '.join(COMPARE_OPS)} in is_null",
        examples=[">="],
    )
    value: Any = Field(
        default=None,
        description="a value of the column's type (a list for `in`; none for `is_null`)",
    )


Filter = FilterAnd | FilterOr | FilterNot | FilterLeaf


def _shape(node: Any) -> dict[str, Any]:
    tree: dict[str, Any] = node.model_dump(by_alias=True, exclude_unset=True)
    try:
        check_filter_shape(tree)
    except SchemaError as e:
        raise rule_error(e.message, e.path or None) from None
    return tree


FilterTree = Annotated[
    Filter,
    AfterValidator(_shape),
    Field(
        description=f"a JSON expression tree over the upstream's columns, at most {MAX_DEPTH} "
        f"levels deep and {MAX_NODES} nodes (docs/api.md#jobs)"
    ),
]
"""A job's filter, as the JSON tree it was given (a ``dict``)."""
