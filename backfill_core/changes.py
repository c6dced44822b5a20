"""Row changes: what a change log yields and what executors emit downstream."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

Row = tuple[Any, ...]


class Op(StrEnum):
    INSERT = "insert"
    DELETE = "delete"
    UPDATE = "update"


@dataclass(frozen=True, slots=True)
class RowChange:
    """One change of a key in one epoch; ``old``/``new`` are full rows (schema order)."""

    op: Op
    vnode: int
    old: Row | None
    new: Row | None

    def __post_init__(self) -> None:
        expect_old = self.op is not Op.INSERT
        expect_new = self.op is not Op.DELETE
        if (self.old is not None) != expect_old or (self.new is not None) != expect_new:
            raise ValueError(f"{self.op} change with old={self.old!r} new={self.new!r}")

    @property
    def row(self) -> Row:
        """The row that identifies the key (the new one, or the old one for a delete)."""
        r = self.new if self.new is not None else self.old
        assert r is not None
        return r


@dataclass(frozen=True, slots=True)
class Version:
    """What a write puts at an epoch: a row, or a tombstone for the row's key."""

    row: Row
    deleted: bool = False
