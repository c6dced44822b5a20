"""Epochs in the public API's JSON: decimal strings out, a string or an integer in.

An epoch is a 64-bit integer (milliseconds since 2021 shifted left 16 bits), well above
2**53 today, so a JSON number loses its low bits in every JavaScript client
(``JSON.parse`` reads ``11698412915982339`` as ``11698412915982340``). The worker
protocol keeps JSON integers: Python reads them exactly at both ends.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema
from pydantic_core import PydanticCustomError

from backfill_core.epoch import MAX_EPOCH

EPOCH_PATTERN = r"^[0-9]{1,19}$"  # MAX_EPOCH has 19 digits
_DIGITS = re.compile("[0-9]{1,19}")  # fullmatch: ``$`` would let a final newline in
_TEXT_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": EPOCH_PATTERN,
    "description": "a 64-bit epoch as a decimal string (beyond a JavaScript number's exact range)",
    "examples": ["11698412915982339"],
}


def _parse(value: Any) -> Any:
    """A decimal string becomes its integer; anything else is left to int's validation."""
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise PydanticCustomError(
                "epoch_format",
                "an epoch is a decimal string of 1 to 19 digits, or an integer",
            )
        return int(value)
    return value


EpochJson = Annotated[
    int,
    Field(ge=0, le=MAX_EPOCH),
    BeforeValidator(_parse),
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema(_TEXT_SCHEMA, mode="serialization"),
    WithJsonSchema(
        {
            "anyOf": [
                {k: v for k, v in _TEXT_SCHEMA.items() if k != "description"},
                {"type": "integer", "minimum": 0, "maximum": MAX_EPOCH},
            ],
            "description": "a 64-bit epoch: a decimal string (better for JavaScript "
            "clients) or an integer",
        },
        mode="validation",
    ),
]
"""An epoch on the public API: a decimal string in JSON, an ``int`` in Python."""

# a committed epoch is at least 1 and at most MAX_EPOCH (2**63 - 1, 19 digits); besides
# the decimal text's pattern, the document says "at least 1, below 9 * 10**18": the bounds
# a pattern can say (epochs reach 9 * 10**18 in the 6380s)
QUERY_BOUNDS = r"^0*(?:[1-9][0-9]{0,17}|[1-8][0-9]{18})$"
_QUERY_BOUNDS = re.compile(QUERY_BOUNDS[1:-1])


def _parse_query(value: Any) -> Any:
    if isinstance(value, str) and _DIGITS.fullmatch(value) and not _QUERY_BOUNDS.fullmatch(value):
        raise PydanticCustomError(
            "epoch_range", "an epoch parameter is at least 1 and below 9 * 10**18"
        )
    return _parse(value)


EpochQuery = Annotated[
    int,
    Field(ge=1, le=MAX_EPOCH),
    BeforeValidator(_parse_query),
    WithJsonSchema(
        _TEXT_SCHEMA
        | {
            "description": "a committed epoch (at least 1), as a decimal string",
            "allOf": [{"pattern": QUERY_BOUNDS}],
        }
    ),
]
"""A query parameter naming an epoch: its text is parsed exactly (never as a float)."""

EpochAfterQuery = Annotated[int, Field(ge=0, le=MAX_EPOCH), BeforeValidator(_parse)]
"""An epoch to read after (0: from the start), parsed exactly as ``EpochQuery``."""


def is_epoch_member(name: str) -> bool:
    """Free-form JSON (event payloads, error details) names its epochs ``epoch`` or
    ``..._epoch``; counts of epochs end in ``_epochs``."""
    return name == "epoch" or name.endswith("_epoch")


def epochs_as_text(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the integer value of every epoch member as a decimal string."""
    return {
        k: str(v) if is_epoch_member(k) and isinstance(v, int) and not isinstance(v, bool) else v
        for k, v in data.items()
    }
