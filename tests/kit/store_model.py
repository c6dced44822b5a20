"""In-memory model of an epoch-versioned table: the specification the store must meet."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from backfill_core.changes import Op, Row, RowChange, Version


@dataclass
class StoreModel:
    key_of: Callable[[Row], Row]
    vnode_of: Callable[[Row], int]
    # key -> {epoch: (deleted, row)}
    versions: dict[Row, dict[int, tuple[bool, Row]]] = field(default_factory=dict)

    def write(self, epoch: int, versions: Iterable[Version]) -> None:
        for v in versions:
            self.versions.setdefault(self.key_of(v.row), {})[epoch] = (v.deleted, v.row)

    def _latest(self, key: Row, upto: int, *, strict: bool = False) -> tuple[bool, Row] | None:
        eps = [e for e in self.versions.get(key, {}) if (e < upto if strict else e <= upto)]
        return self.versions[key][max(eps)] if eps else None

    def _order(self, key: Row) -> tuple[int, Row]:
        return (self.vnode_of(self.versions[key][next(iter(self.versions[key]))][1]), key)

    def snapshot(self, epoch: int) -> list[tuple[int, Row]]:
        out = []
        for key in self.versions:
            latest = self._latest(key, epoch)
            if latest is not None and not latest[0]:
                out.append((self.vnode_of(latest[1]), latest[1]))
        return sorted(out, key=lambda vr: (vr[0], self.key_of(vr[1])))

    def change_log(self, epoch: int) -> list[RowChange]:
        return self.change_log_range(epoch - 1, epoch)

    def change_log_range(self, after: int, upto: int) -> list[RowChange]:
        """Net change per key over epochs (after, upto]."""
        out = []
        for key, eps in self.versions.items():
            inside = [e for e in eps if after < e <= upto]
            if not inside:
                continue
            deleted, new = eps[max(inside)]
            prev = self._latest(key, after)
            old = prev[1] if prev is not None and not prev[0] else None
            vnode = self.vnode_of(new)
            if deleted and old is not None:
                out.append(RowChange(Op.DELETE, vnode, old, None))
            elif not deleted and old is None:
                out.append(RowChange(Op.INSERT, vnode, None, new))
            elif not deleted:
                out.append(RowChange(Op.UPDATE, vnode, old, new))
        return sorted(out, key=lambda c: (c.vnode, self.key_of(c.row)))

    def rollback(self, committed: int) -> None:
        for eps in self.versions.values():
            for e in [e for e in eps if e > committed]:
                del eps[e]

    def gc(self, safe_epoch: int) -> None:
        for eps in self.versions.values():
            below = [e for e in eps if e <= safe_epoch]
            if not below:
                continue
            keep = max(below)
            for e in below:
                if e < keep or eps[keep][0]:
                    del eps[e]

    def epochs(self) -> set[int]:
        return {e for eps in self.versions.values() for e in eps}
