"""``backfill demo``: drive the running service end to end over its own HTTP API."""

from __future__ import annotations

import asyncio
import random
import time

import httpx

DEMO_TABLE = "demo_orders"
ROWS = 20_000
BATCH = 2_000


async def run_demo(base_url: str, *, keep_running: bool = False) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        ready = (await http.get("/readyz")).json()
        print(
            f"database reachable: {ready['database']}, catalog at migration {ready['migrations']}"
        )
        if (await http.get(f"/v1/tables/{DEMO_TABLE}")).status_code == 200:
            await _ok(await http.delete(f"/v1/tables/{DEMO_TABLE}"))
        await _ok(
            await http.post(
                "/v1/tables",
                json={
                    "name": DEMO_TABLE,
                    "columns": [
                        {"name": "id", "type": "bigint", "nullable": False},
                        {"name": "customer", "type": "text"},
                        {"name": "amount", "type": "numeric"},
                    ],
                    "primary_key": ["id"],
                },
            )
        )
        print(f"created table {DEMO_TABLE}; loading {ROWS:,} rows in batches of {BATCH:,}")
        rng = random.Random(7)
        started = time.perf_counter()
        epoch = 0
        for lo in range(0, ROWS, BATCH):
            ops = [
                {
                    "op": "insert",
                    "row": {
                        "id": i,
                        "customer": f"c{rng.randrange(500)}",
                        "amount": str(rng.randrange(1, 10_000) / 100),
                    },
                }
                for i in range(lo, lo + BATCH)
            ]
            r = await _ok(await http.post(f"/v1/tables/{DEMO_TABLE}/dml", json={"ops": ops}))
            epoch = r["epoch"]
        changes = [{"op": "update", "row": {"id": i, "amount": "0.01"}} for i in range(0, 100)]
        changes += [{"op": "delete", "row": {"id": i}} for i in range(100, 150)]
        r = await _ok(
            await http.post(
                f"/v1/tables/{DEMO_TABLE}/dml", params={"wait": "true"}, json={"ops": changes}
            )
        )
        print(
            f"loaded and changed rows in {time.perf_counter() - started:.1f}s; last epoch {r['epoch']} committed"
        )
        assert r["epoch"] >= epoch
        count, after = 0, None
        while True:
            params: dict[str, object] = {"limit": 1000}
            if after:
                params["after"] = after
            page = await _ok(await http.get(f"/v1/tables/{DEMO_TABLE}/rows", params=params))
            count += len(page["rows"])
            after = page["next"]
            if after is None:
                break
        expected = ROWS - 50
        print(
            f"read back {count:,} rows at committed epoch {page['epoch']} (expected {expected:,})"
        )
        if count != expected:
            raise SystemExit(f"demo failed: read {count} rows, expected {expected}")
        metrics = (await http.get("/metrics")).text
        committed = [ln for ln in metrics.splitlines() if ln.startswith("backfill_committed_epoch")]
        print("barrier loop: " + (committed[0] if committed else "no commits yet"))
        print(f"API docs: {base_url}/docs")
    if keep_running:
        print("serving until interrupted (Ctrl-C)", flush=True)
        await asyncio.Event().wait()


async def _ok(r: httpx.Response) -> dict:  # type: ignore[type-arg]
    if r.status_code >= 400:
        raise SystemExit(
            f"demo failed: {r.request.method} {r.request.url} -> {r.status_code} {r.text}"
        )
    return r.json() if r.content else {}
