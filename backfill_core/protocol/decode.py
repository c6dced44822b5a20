"""Checked reads of a message's JSON: a missing member or one of the wrong type is a
``MalformedMessage`` naming it (the control plane's edge answers it with a 422), never
a ``KeyError`` or a value silently converted (``int("5")``, ``int(True)``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class MalformedMessage(ValueError):
    """A message's JSON is not the protocol's."""


_MISSING = object()


def obj(value: Any, what: str = "message") -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise MalformedMessage(f"{what} is not an object")
    return value


def items(value: Any, what: str) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise MalformedMessage(f"{what} is not an array")
    return value


def get(d: Mapping[str, Any], key: str, default: Any = _MISSING) -> Any:
    value = d.get(key, default)
    if value is _MISSING:
        raise MalformedMessage(f"{key} is missing")
    return value


def integer(d: Mapping[str, Any], key: str, default: Any = _MISSING) -> int:
    value = get(d, key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedMessage(f"{key} is not an integer")
    return value


def opt_integer(d: Mapping[str, Any], key: str) -> int | None:
    return None if d.get(key) is None else integer(d, key)


def text(d: Mapping[str, Any], key: str) -> str:
    value = get(d, key)
    if not isinstance(value, str):
        raise MalformedMessage(f"{key} is not a string")
    return value


def boolean(d: Mapping[str, Any], key: str, default: bool) -> bool:
    value = get(d, key, default)
    if not isinstance(value, bool):
        raise MalformedMessage(f"{key} is not a boolean")
    return value
