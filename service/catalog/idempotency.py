"""Idempotency keys: a create retried with the same key does its work once.

A key is claimed *inside* the create's transaction (``claim``, first thing), and names
what it created there too (``created``), so the object and its key commit together or
not at all. A concurrent request with the same key blocks on the claim until the first
transaction ends: if that one committed, the claim fails with ``KeyTaken`` and the
request replays the first one's answer; if it rolled back (an error), the key is free
again. The answer (status and exact body) is recorded right after the commit
(``record``). Errors are never recorded: a failed request leaves no key behind.

Keys expire after a TTL; expired ones are ignored, and deleted lazily (``find`` sweeps a
few at a time, ``claim`` drops an expired row of its own key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.catalog.models import IdempotencyKey
from service.db import Database

SWEEP_BATCH = 100


class KeyTaken(Exception):
    """Another request holds this key (its transaction committed first)."""


@dataclass(frozen=True)
class Claim:
    key: str
    fingerprint: str  # sha256 of method, path and the canonical JSON body
    method: str
    path: str
    ttl_s: int
    # the first request records its answer within this long after its commit; a retry
    # after that finds it never will (a crash in between) and answers for it
    respond_within_s: float = 60.0


@dataclass(frozen=True)
class Recorded:
    key: str
    fingerprint: str
    resource: dict[str, Any] | None
    status_code: int | None
    response: str | None
    overdue: bool  # not recorded and past its respond_by


def _interval(seconds: float) -> Any:
    return func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def find(db: Database, key: str) -> Recorded | None:
    """The live (unexpired) record of ``key``; also deletes a few expired keys."""
    with db.transaction() as s:
        expired = (
            select(IdempotencyKey.key)
            .where(IdempotencyKey.expires_at <= func.now())
            .order_by(IdempotencyKey.expires_at)
            .limit(SWEEP_BATCH)
            .with_for_update(skip_locked=True)
        )
        s.execute(delete(IdempotencyKey).where(IdempotencyKey.key.in_(expired.scalar_subquery())))
        row = s.execute(
            select(IdempotencyKey, IdempotencyKey.respond_by < func.now()).where(
                IdempotencyKey.key == key, IdempotencyKey.expires_at > func.now()
            )
        ).one_or_none()
        if row is None:
            return None
        k, late = row
        return Recorded(
            k.key,
            k.fingerprint,
            k.resource,
            k.status_code,
            k.response,
            bool(late and k.status_code is None),
        )


def claim(s: Session, c: Claim) -> None:
    """Take ``c.key`` in the create's transaction; raises KeyTaken if another request
    committed it first (blocks while another uncommitted transaction holds it)."""
    s.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.key == c.key, IdempotencyKey.expires_at <= func.now()
        )
    )
    taken = s.execute(
        insert(IdempotencyKey)
        .values(
            key=c.key,
            fingerprint=c.fingerprint,
            method=c.method,
            path=c.path,
            respond_by=func.now() + _interval(c.respond_within_s),
            expires_at=func.now() + _interval(c.ttl_s),
        )
        .on_conflict_do_nothing(index_elements=[IdempotencyKey.key])
        .returning(IdempotencyKey.key)
    ).first()
    if taken is None:
        raise KeyTaken(c.key)


def created(s: Session, c: Claim | None, resource: dict[str, Any]) -> None:
    """Name what the claimed request created (in the same transaction)."""
    if c is not None:
        s.execute(
            update(IdempotencyKey).where(IdempotencyKey.key == c.key).values(resource=resource)
        )


def record(db: Database, key: str, fingerprint: str, status_code: int, response: str) -> Recorded:
    """Keep the first answer given for ``key``; returns the one kept (an earlier one
    wins if a late retry answered for a request that looked dead)."""
    with db.transaction() as s:
        s.execute(
            update(IdempotencyKey)
            .where(
                IdempotencyKey.key == key,
                IdempotencyKey.fingerprint == fingerprint,
                IdempotencyKey.status_code.is_(None),
            )
            .values(status_code=status_code, response=response)
        )
        k = s.get(IdempotencyKey, key)
        if k is None or k.status_code is None or k.response is None:
            return Recorded(key, fingerprint, None, status_code, response, False)
        return Recorded(k.key, k.fingerprint, k.resource, k.status_code, k.response, False)
