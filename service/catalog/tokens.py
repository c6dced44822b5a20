"""Bearer tokens: stored as sha256 hashes with their role, never in plain text.

``sync`` runs at each start: the tokens given in settings replace the ones an earlier
start was given (``source = 'settings'``), the tokens an earlier start issued for its
embedded worker or a demo session are dropped, and when no admin token exists at all
one is generated (``'generated'``) and returned, to be shown once. ``TokenAuthority`` answers "which role has this token" from
an in-memory snapshot of the table, reloaded every few seconds (and on an unknown token,
at most a few times a second), so a request costs one sha256 and a dict lookup.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal

from sqlalchemy import delete, select, text
from sqlalchemy.dialects.postgresql import insert

from service.catalog.models import ApiToken
from service.db import Database

log = logging.getLogger(__name__)

Role = Literal["admin", "reader", "worker"]
ROLES: tuple[Role, ...] = ("admin", "reader", "worker")
SETTINGS, GENERATED, EMBEDDED_WORKER, SESSION = (
    "settings",
    "generated",
    "embedded-worker",
    "session",
)
PER_START = (EMBEDDED_WORKER, SESSION)  # a process's own tokens, left over if it died
TOKEN_LOCK_ID = 0x6D76_746B  # "mvtk": two replicas starting at once generate one token

RELOAD_S = 2.0  # a token revoked elsewhere stops working within this long
MISS_RELOAD_S = 0.25  # unknown tokens reload the snapshot at most this often


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def sync(db: Database, configured: Mapping[Role, str]) -> str | None:
    """Store the configured tokens' hashes (role -> hash) in place of earlier ones, drop
    the tokens an earlier start issued for itself, and generate an admin token if there is none;
    returns that new token (the only time it exists in plain text), else None."""
    hashes = set(configured.values())
    with db.transaction() as s:
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": TOKEN_LOCK_ID})
        s.execute(
            delete(ApiToken).where(
                ApiToken.source.in_(PER_START)
                | ((ApiToken.source == SETTINGS) & ApiToken.token_hash.not_in(hashes))
            )
        )
        for role, token_hash in configured.items():
            stmt = insert(ApiToken).values(token_hash=token_hash, role=role, source=SETTINGS)
            s.execute(
                stmt.on_conflict_do_update(
                    index_elements=[ApiToken.token_hash], set_={"role": role, "source": SETTINGS}
                )
            )
        if "admin" in configured:  # a configured admin token takes over from a generated one
            s.execute(
                delete(ApiToken).where(ApiToken.source == GENERATED, ApiToken.role == "admin")
            )
            return None
        if s.execute(select(ApiToken.token_hash).where(ApiToken.role == "admin")).first():
            return None
        token = new_token()
        s.add(ApiToken(token_hash=hash_token(token), role="admin", source=GENERATED))
        return token


def store(db: Database, token_hash: str, role: Role, source: str) -> None:
    with db.transaction() as s:
        s.add(ApiToken(token_hash=token_hash, role=role, source=source))


def revoke(db: Database, token_hash: str) -> None:
    with db.transaction() as s:
        s.execute(delete(ApiToken).where(ApiToken.token_hash == token_hash))


def load(db: Database) -> dict[str, Role]:
    with db.transaction() as s:
        rows = s.execute(select(ApiToken.token_hash, ApiToken.role)).all()
    return {h: role for h, role in rows if role in ROLES}


class TokenAuthority:
    """This process's view of the valid tokens: its own (configured and issued, always
    valid here, even while the database is unreachable) and the stored ones."""

    def __init__(
        self, configured: Mapping[Role, str], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.configured = {hash_token(t): role for role, t in configured.items()}
        self._own: dict[str, Role] = dict(self.configured)
        self._issued: set[str] = set()  # hashes of the tokens this start issued
        self._stored: dict[str, Role] = {}
        self._loaded_at = float("-inf")
        self._clock = clock
        self._lock = threading.Lock()
        self.db: Database | None = None
        self.synced = False

    def start(self, db: Database) -> str | None:
        """Sync the table (see ``sync``); returns a newly generated admin token, if any.
        A database that cannot be reached now is retried at the next reload."""
        self.db = db
        return self._sync()

    def _sync(self) -> str | None:
        assert self.db is not None
        by_role: dict[Role, str] = {role: h for h, role in self.configured.items()}
        try:
            generated = sync(self.db, by_role)
            stored = load(self.db)
        except Exception as e:
            log.warning("cannot store the API tokens yet (%s); retrying later", e)
            return None
        self.synced = True
        self._stored, self._loaded_at = stored, self._clock()
        if generated is not None:  # stored, so in the snapshot just loaded
            announce_admin_token(generated)
        return generated

    def issue(self, role: Role, source: str) -> str:
        """A new token of ``role`` (for the embedded worker, or a session), valid at once."""
        token = new_token()
        token_hash = hash_token(token)
        self._own[token_hash] = role
        self._issued.add(token_hash)
        if self.db is not None:
            try:
                store(self.db, token_hash, role, source)
            except Exception as e:
                log.warning("cannot store an issued %s token (%s)", role, e)
        return token

    def retire(self, token: str) -> None:
        """Revoke a token this start issued (nothing if it is revoked already)."""
        self._retire(hash_token(token))

    def retire_issued(self) -> None:
        """Revoke every token this start issued: at shutdown, while the database is still
        there. Their holders may not retire them: a demo serving until it is stopped
        (SIGTERM ends it without unwinding; on Ctrl-C it unwinds only after the
        shutdown, when an embedded Postgres is stopped already)."""
        for token_hash in list(self._issued):
            self._retire(token_hash)

    def _retire(self, token_hash: str) -> None:
        if token_hash not in self._issued:
            return
        self._issued.discard(token_hash)
        self._own.pop(token_hash, None)
        self._stored.pop(token_hash, None)
        if self.db is not None:
            try:
                revoke(self.db, token_hash)
            except Exception as e:
                log.warning("cannot revoke a token (%s)", e)

    def role_of(self, token: str) -> Role | None:
        """The role of a presented token, or None (may read the database)."""
        token_hash = hash_token(token)
        self.reload_if_due(token_hash)
        return self.lookup(token_hash)

    def lookup(self, token_hash: str) -> Role | None:
        """From memory only."""
        return self._own.get(token_hash) or self._stored.get(token_hash)

    def due(self, token_hash: str) -> bool:
        """Whether a lookup of this hash should reload the snapshot first."""
        if self.db is None:
            return False
        age = self._clock() - self._loaded_at
        known = token_hash in self._own or token_hash in self._stored
        return age >= RELOAD_S or (not known and age >= MISS_RELOAD_S)

    def reload_if_due(self, token_hash: str) -> None:
        """Blocking (a query): off the event loop. One request reloads at a time; the
        others meanwhile answer from the snapshot they have (never wait for a query)."""
        if not self.due(token_hash) or not self._lock.acquire(blocking=False):
            return
        try:
            if not self.due(token_hash):
                return
            self._loaded_at = self._clock()
            if not self.synced:
                self._sync()
            assert self.db is not None
            self._stored = load(self.db)
        except Exception as e:  # keep the last snapshot: a blip must not lock anyone out
            log.warning("cannot reload the API tokens (%s)", e)
        finally:
            self._lock.release()


def announce_admin_token(token: str) -> None:
    """Show a generated admin token once, on stderr (never through logging, whose
    handlers may ship it elsewhere)."""
    import sys

    print(
        f"\n*** admin token: {token} (shown once; keep it, only its hash is stored) ***\n"
        "*** use it as 'Authorization: Bearer <token>', or open /dashboard#token=<token> ***\n",
        file=sys.stderr,
        flush=True,
    )
    log.warning("generated an admin token and printed it to stderr (shown once)")
