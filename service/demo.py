"""``backfill demo``: drive the running service end to end over its own HTTP API."""

from __future__ import annotations

import asyncio

import httpx


async def run_demo(base_url: str, *, keep_running: bool = False) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        ready = (await http.get("/readyz")).json()
        print(
            f"database reachable: {ready['database']}, catalog at migration {ready['migrations']}"
        )
        print(f"API docs: {base_url}/docs")
    if keep_running:
        print("serving until interrupted (Ctrl-C)", flush=True)
        await asyncio.Event().wait()
