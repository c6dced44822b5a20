"""One reader of new events per control-plane process, shared by every following stream
(``docs/api.md#events``): each open ``GET .../events?follow=true`` used to poll Postgres
on its own, so a few hundred dashboards slowed every other request.

A stream catches up from the database, then takes new events from the hub's buffer,
which holds every event after ``base``; one further behind than the buffer reads the
database again. The hub polls only while some stream follows.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import func, select

from service.catalog import events
from service.catalog.models import Event
from service.db import Database
from service.errors import ServiceError

log = logging.getLogger(__name__)

POLL_S = 0.25
BUFFERED = 10_000  # events kept for streams that lag a little


class TooManyStreams(ServiceError):
    status = 429
    code = "too_many_streams"


class EventHub:
    def __init__(self, db: Database, max_streams_per_client: int, poll_s: float = POLL_S):
        self.db = db
        self.poll_s = poll_s
        self.max_streams_per_client = max_streams_per_client
        self._buffer: deque[Event] = deque(maxlen=BUFFERED)
        self._base: int | None = None  # the buffer holds every event with a greater id
        self._latest = 0
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._streams: Counter[str] = Counter()
        self.reads = 0  # the hub's reads of the database (tests count them)

    def check_cap(self, client: str) -> None:
        """429 when ``client`` (its token, or its address) holds as many following
        streams open as it may."""
        if self._streams[client] >= self.max_streams_per_client:
            raise TooManyStreams(
                f"at most {self.max_streams_per_client} event streams may be open per "
                "token; close one (a dashboard needs one)",
                {"limit": self.max_streams_per_client},
                headers={"Retry-After": "5"},
            )

    @asynccontextmanager
    async def following(self, client: str) -> AsyncIterator[None]:
        """A stream that follows, counted for ``client`` while it runs."""
        self._streams[client] += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll())
        try:
            yield
        finally:
            self._streams[client] -= 1
            if not self._streams[client]:
                del self._streams[client]

    @property
    def followers(self) -> int:
        return sum(self._streams.values())

    def since(self, last: int, job_id: int | None) -> list[Event] | None:
        """The buffered events after ``last`` (of one job, or all); None when the buffer
        does not reach back to ``last``: the stream reads the database."""
        if self._base is None or last < self._base:
            return None
        # ids grow along the buffer: walk back from the newest, not over all of it (every
        # following stream asks at every wake)
        newer: list[Event] = []
        for e in reversed(self._buffer):
            if e.id <= last:
                break
            if job_id is None or e.job_id == job_id:
                newer.append(e)
        newer.reverse()
        return newer

    async def wait(self, timeout_s: float) -> None:
        """Until the hub took in new events, or ``timeout_s``."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll())
        if self._changed is None:
            self._changed = asyncio.Event()
        changed = self._changed
        with suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout_s)

    async def _poll(self) -> None:
        try:
            while self.followers:
                try:
                    if self._base is None:
                        self._latest = await run_in_threadpool(self._max_id)
                        self._base = self._latest
                    batch = await run_in_threadpool(events.after, self.db, self._latest)
                except Exception as e:  # the database is away: streams wait, then go on
                    log.warning("could not read new events: %s", e)
                    await asyncio.sleep(self.poll_s * 4)
                    continue
                self.reads += 1
                if batch:
                    self._buffer.extend(batch)
                    self._latest = batch[-1].id
                    if len(self._buffer) == self._buffer.maxlen:
                        self._base = self._buffer[0].id - 1
                    changed, self._changed = self._changed, asyncio.Event()
                    if changed is not None:
                        changed.set()
                if len(batch) < events.PAGE:
                    await asyncio.sleep(self.poll_s)
        finally:
            # nobody follows: forget the buffer, the next follower starts afresh
            self._buffer.clear()
            self._base = None
            self._task = None

    def _max_id(self) -> int:
        with self.db.transaction() as s:
            return int(s.execute(select(func.coalesce(func.max(Event.id), 0))).scalar_one())
