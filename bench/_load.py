"""An open-loop HTTP load generator that costs the measurement next to nothing.

Request ``i`` is due at ``start + i / rate``, whatever happened to the earlier ones (an
answer that is late never delays the next request: no coordinated omission). Latency is
measured **from the due time** to the last byte of the answer, so it includes any wait
for a free connection and any lateness of the generator itself; that lateness (the
actual send time minus the due time) is reported on its own as ``send_lag_ms``, so a
figure can show how much of it is the harness.

One asyncio loop on raw keep-alive HTTP/1.1 connections with the request bytes built
once per path: no HTTP client library and no threads, so a few hundred requests a second
take a few percent of a core. Run it in a process that does nothing else meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_CONNECTIONS = 64


@dataclass
class LoadResult:
    latency_ms: list[float] = field(default_factory=list)  # from the due time
    send_lag_ms: list[float] = field(default_factory=list)  # actual send time - due time
    errors: list[str] = field(default_factory=list)


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def fetch(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        body = await self.reader.readexactly(length) if length else b""
        return status, body


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def open_loop(
    base: str, paths: list[str], rate: float, seconds: float, token: str | None = None
) -> LoadResult:
    """GET ``paths`` round-robin at ``rate`` per second for ``seconds``; every answer
    must be a 200 (anything else is in ``errors``)."""
    return asyncio.run(_run(base, paths, rate, seconds, token))


async def _run(
    base: str, paths: list[str], rate: float, seconds: float, token: str | None
) -> LoadResult:
    url = urlsplit(base)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    requests = [f"GET {p} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}\r\n".encode() for p in paths]
    idle: deque[_Conn] = deque()  # oldest first: every connection is kept busy

    async def connect() -> _Conn:
        return _Conn(*await asyncio.open_connection(host, port))

    limit = asyncio.Semaphore(MAX_CONNECTIONS)
    out = LoadResult()

    async def one(i: int, due: float) -> None:
        async with limit:
            reused = bool(idle)
            conn = idle.popleft() if reused else await connect()
            out.send_lag_ms.append((time.perf_counter() - due) * 1000)
            request = requests[i % len(requests)]
            try:
                try:
                    status, body = await conn.fetch(request)
                except (ConnectionError, asyncio.IncompleteReadError):
                    if not reused:
                        raise
                    conn.writer.close()  # the server closed an idle keep-alive connection
                    conn = await connect()
                    status, body = await conn.fetch(request)
            except (OSError, asyncio.IncompleteReadError) as e:
                out.errors.append(f"{type(e).__name__}: {e}")
                conn.writer.close()
                return
            out.latency_ms.append((time.perf_counter() - due) * 1000)
            if status != 200:
                out.errors.append(f"{status}: {body[:200]!r}")
            idle.append(conn)

    for _ in range(8):  # warm connections, as a dashboard fleet keeps them
        idle.append(await connect())
    start = time.perf_counter()
    tasks = []
    for i in range(int(seconds * rate)):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the load, not synchronisation
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    for conn in idle:
        conn.writer.close()
    return out
