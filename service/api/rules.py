"""Field rules of the request models that the OpenAPI document publishes as constraints.

Each rule is checked in the request model (so a bad name is refused before anything is
read or stored) and carries its JSON schema (a pattern), so that a client generated from
``openapi.yaml`` validates it as the service does. A broken rule is the service's usual
422 ``invalid`` naming the field (``columns[0].name``), not pydantic's
``validation_error``: ``service.api.errors`` answers an error of type ``RULE`` so. (An
empty name is a ``validation_error``, as any value of a length the schema refuses.)
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from backfill_core.schema import (
    MAX_IDENTIFIER_LEN,
    TYPE_ALIASES,
    ColumnType,
    SchemaError,
    validate_identifier,
)

RULE = "invalid"  # the error type of a broken rule, and the code of its answer
# backfill_core.schema.IDENTIFIER_RE, as a JSON schema pattern (ECMA-262: `$` is the end)
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"
# a column of a source's rows may also be one of the added ones (`_partition`, `_offset`)
COLUMN_REF_PATTERN = r"^_?[a-z][a-z0-9_]{0,62}$"


def rule_error(message: str, field: str | None = None) -> PydanticCustomError:
    """A broken rule; ``field`` names where when it is not the field checked (a filter's
    node): ``filter.and[1].op``."""
    return PydanticCustomError(RULE, "{message}", {"message": message, "field": field})


def _rule(check: Any) -> Any:
    def run(value: Any) -> Any:
        try:
            check(value)
        except SchemaError as e:
            raise rule_error(e.message, e.path or None) from None
        return value

    return AfterValidator(run)


def _name_schema(pattern: str, what: str) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "type": "string",
            "pattern": pattern,
            "minLength": 1,
            "maxLength": MAX_IDENTIFIER_LEN,
            "description": f"{what}: 1 to {MAX_IDENTIFIER_LEN} characters, a lower-case "
            "letter first, then lower-case letters, digits or '_'",
        }
    )


Name = Annotated[
    str,
    Field(min_length=1, max_length=MAX_IDENTIFIER_LEN),
    _rule(lambda v: validate_identifier(v)),
    _name_schema(NAME_PATTERN, "a name"),
]
"""A table's, a column's, a source's or a job's name."""

ColumnRef = Annotated[
    str,
    Field(min_length=1, max_length=MAX_IDENTIFIER_LEN),
    _rule(lambda v: validate_identifier(v, "column name", allow_internal=True)),
    _name_schema(COLUMN_REF_PATTERN, "a column of the upstream (`_partition` and `_offset` too)"),
]
"""A column of a job's upstream."""

TYPE_NAMES = sorted({*(t.value for t in ColumnType), *TYPE_ALIASES})
TYPE_DESCRIPTION = f"one of {', '.join(TYPE_NAMES)}; another is a 422 `invalid` naming the column"
