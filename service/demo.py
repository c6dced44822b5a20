"""``backfill demo``: drive the running service end to end over its own HTTP API."""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from service.catalog.tokens import SESSION
from service.context import ServiceContext

DEMO_TABLE = "demo_orders"
ROWS = 20_000
BATCH = 2_000


async def demo_session(base_url: str, ctx: ServiceContext, *, keep_running: bool) -> None:
    """The demo with an admin token of its own, valid while it runs (none if auth is off)."""
    token = ctx.auth.issue("admin", SESSION) if ctx.auth is not None else None
    try:
        await run_demo(base_url, token=token, keep_running=keep_running)
    finally:
        if ctx.auth is not None and token is not None:
            ctx.auth.retire(token)


async def run_demo(base_url: str, *, token: str | None = None, keep_running: bool = False) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with httpx.AsyncClient(base_url=base_url, timeout=60, headers=headers) as http:
        ready = (await http.get("/readyz")).json()
        print(
            f"database reachable: {ready['database']}, catalog at migration {ready['migrations']}"
        )
        for j in (await http.get("/v1/jobs")).json()["jobs"]:
            await _ok(await http.delete(f"/v1/jobs/{j['id']}"))
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
            epoch = int(r["epoch"])  # a decimal string (docs/api.md#epochs)
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
        assert int(r["epoch"]) >= epoch
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
        print("creating a materialized view of the big orders while a writer keeps going")
        if (await http.get("/v1/jobs")).json()["jobs"]:
            for j in (await http.get("/v1/jobs")).json()["jobs"]:
                await _ok(await http.delete(f"/v1/jobs/{j['id']}"))
        writer = asyncio.create_task(_writer(http, ROWS))
        job = await _ok(
            await http.post(
                "/v1/jobs",
                json={
                    "name": "demo_big_orders",
                    "upstream": {"table": DEMO_TABLE},
                    "columns": ["id", "amount"],
                    "filter": {"col": "amount", "op": ">=", "value": 50},
                    "backfill": "auto",  # a snapshot backfill, decoupled from the writer
                    "parallelism": 4,
                },
            )
        )
        deadline = time.monotonic() + 60
        while True:
            p = await _ok(await http.get(f"/v1/jobs/{job['id']}/progress"))
            bar = "#" * int(p["percent"] / 5)
            print(
                f"  [{bar:<20}] {p['percent']:6.2f}%  {p['rows']:,} rows  {p['phase']}", flush=True
            )
            if p["state"] == "created":
                break
            if time.monotonic() > deadline:
                raise SystemExit("demo failed: the job was not created within 60 s")
            await asyncio.sleep(0.5)
        for _ in range(3):
            v = await _ok(await http.get(f"/v1/jobs/{job['id']}/verify"))
            print(f"  verify at epoch {v['epoch']}: equal={v['equal']} ({v['mv_rows']:,} rows)")
            if not v["equal"]:
                raise SystemExit(f"demo failed: the view differs from its upstream: {v}")
            await asyncio.sleep(0.3)
        writer.cancel()
        print(f"materialized view demo_big_orders is created and exact ({v['mv_rows']:,} rows)")
        metrics = (await http.get("/metrics")).text
        committed = [ln for ln in metrics.splitlines() if ln.startswith("backfill_committed_epoch")]
        print("barrier loop: " + (committed[0] if committed else "no commits yet"))
        print(f"API docs: {base_url}/docs")
    if keep_running:
        if token is not None:
            print(
                f"dashboard (this token works until the demo stops): {base_url}/dashboard#token={token}"
            )
        print("serving until interrupted (Ctrl-C)", flush=True)
        await asyncio.Event().wait()


async def _writer(http: httpx.AsyncClient, first_new: int) -> None:
    """Keeps changing the upstream while the view is built."""
    rng = random.Random(11)
    key = first_new
    while True:
        ops = [
            {
                "op": "insert",
                "row": {"id": key + i, "customer": "late", "amount": str(rng.randrange(100))},
            }
            for i in range(20)
        ]
        ops += [
            {
                "op": "update",
                "row": {"id": rng.randrange(150, first_new), "amount": str(rng.randrange(100))},
            }
            for _ in range(5)
        ]
        key += 20
        await _ok(await http.post(f"/v1/tables/{DEMO_TABLE}/dml", json={"ops": ops}))
        await asyncio.sleep(0.05)


async def _ok(r: httpx.Response) -> dict:  # type: ignore[type-arg]
    if r.status_code >= 400:
        raise SystemExit(
            f"demo failed: {r.request.method} {r.request.url} -> {r.status_code} {r.text}"
        )
    return r.json() if r.content else {}
