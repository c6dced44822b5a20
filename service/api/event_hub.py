"""One reader of new events per control-plane process, shared by every following stream
(``docs/api.md#events``): each open ``GET .../events?follow=true`` used to poll Postgres
on its own, so a few hundred dashboards slowed every other request.

A stream catches up from the database, then takes new events from the hub's buffer,
which holds every event after ``base``; one further behind than the buffer reads the
database again. The hub polls only while some stream follows.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import func, select

from service.api.epochs import epochs_as_text
from service.catalog import events
from service.catalog.models import Event
from service.db import Database
from service.errors import ServiceError

log = logging.getLogger(__name__)

POLL_S = 0.25
BUFFERED = 10_000  # events kept for streams that lag a little
WAKE_GROUP = 8  # streams woken before other callbacks get a turn


@dataclass(frozen=True, slots=True)
class Sent:
    """An event as a stream sends it: formatted once, for every stream."""

    id: int
    job_id: int | None
    text: str

    @classmethod
    def of(cls, e: Event) -> Sent:
        # stored with integer epochs, sent as strings, as in every answer
        data = {"job_id": e.job_id, "at": e.created_at.isoformat(), **epochs_as_text(e.data)}
        return cls(e.id, e.job_id, f"id: {e.id}\nevent: {e.kind}\ndata: {json.dumps(data)}\n\n")


class TooManyStreams(ServiceError):
    status = 429
    code = "too_many_streams"


class EventHub:
    def __init__(self, db: Database, max_streams_per_client: int, poll_s: float = POLL_S):
        self.db = db
        self.poll_s = poll_s
        self.max_streams_per_client = max_streams_per_client
        self._buffer: deque[Sent] = deque(maxlen=BUFFERED)
        self._base: int | None = None  # the buffer holds every event with a greater id
        self._latest = 0
        # the streams waiting for new events, woken a group at a time (``_wake``)
        self._waiters: list[asyncio.Future[None]] = []
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

    def since(self, last: int, job_id: int | None) -> list[Sent] | None:
        """The buffered events after ``last`` (of one job, or all); None when the buffer
        does not reach back to ``last``: the stream reads the database."""
        if self._base is None or last < self._base:
            return None
        # ids grow along the buffer: walk back from the newest, not over all of it (every
        # following stream asks at every wake)
        newer: list[Sent] = []
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
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if len(self._waiters) > 2 * self.followers + 100:  # those that timed out, gone
            self._waiters = [w for w in self._waiters if not w.done()]
        self._waiters.append(woken)
        # a timeout scope, not wait_for: that makes a task per call, a thousand at
        # every wake of a thousand streams
        try:
            with suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await woken
        finally:
            if not woken.done():
                woken.cancel()

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
                    self._buffer.extend(Sent.of(e) for e in batch)
                    self._latest = batch[-1].id
                    if len(self._buffer) == self._buffer.maxlen:
                        self._base = self._buffer[0].id - 1
                    await self._wake()
                if len(batch) < events.PAGE:
                    await asyncio.sleep(self.poll_s)
        finally:
            # nobody follows: forget the buffer, the next follower starts afresh
            self._buffer.clear()
            self._base = None
            self._task = None

    async def _wake(self) -> None:
        """Wake the waiting streams ``WAKE_GROUP`` at a time, letting the event loop
        answer other requests between groups: woken all at once, a thousand streams
        held every other answer back until each had written."""
        waiters, self._waiters = self._waiters, []
        for i, woken in enumerate(waiters, 1):
            if not woken.done():
                woken.set_result(None)
            if i % WAKE_GROUP == 0:
                await asyncio.sleep(0)

    def _max_id(self) -> int:
        with self.db.transaction() as s:
            return int(s.execute(select(func.coalesce(func.max(Event.id), 0))).scalar_one())
