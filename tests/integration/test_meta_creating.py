"""The meta side of a snapshot backfill, with a scripted fake worker and a hand-driven
barrier loop: fake epochs while the snapshot is read, the upstream's epochs one by one
after it, recovery in either phase, and the merge into the main graph."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from backfill_core.protocol import ErrorCode
from service.catalog.models import EpochPin, Graph
from service.db import Database
from service.meta import barriers
from service.meta.creating import fake_epoch_after, merge_ceiling
from service.meta.loop import CREATING, MetaLoop
from service.usecases import jobs as jobs_usecase
from tests.integration.test_health_and_errors import assert_error
from tests.kit.meta import (
    FakeWorker,
    actors_of,
    barriers_of,
    committed_epoch,
    main_committed_epochs,
    manual_api,
    statements,
)

TABLE = {
    "name": "orders",
    "columns": [{"name": "id", "type": "bigint"}, {"name": "v", "type": "text"}],
    "primary_key": ["id"],
    "vnode_count": 8,
}


def collect(
    w: FakeWorker, state: str, only: set[int] | None = None, before: int | None = None
) -> list[dict[str, Any]]:
    """Collect every ready barrier (of the actors in ``only``, opening an epoch before
    ``before``, if given), every vnode reported in ``state``; returns them."""
    seen = []
    for a in w.poll():
        if only is not None and a["actor_id"] not in only:
            continue
        vnodes = [v for lo, hi in a["vnodes"] for v in range(lo, hi)]
        for b in a["barriers"]:
            if before is not None and b["curr"] >= before:
                break
            progress = {
                "vnodes": [
                    {"vnode": v, "state": state, "current_pos": None, "row_count": 1}
                    for v in vnodes
                ]
            }
            r = w.collect(a["actor_id"], b, progress=progress)
            assert r.status_code == 200, r.text
            seen.append(b | {"graph_id": a["graph_id"]})
    return seen


def snapshot_job(client: TestClient, loop: MetaLoop, parallelism: int) -> dict[str, Any]:
    """The table, a few committed upstream epochs, then a snapshot job reading it."""
    assert client.post("/v1/tables", json=TABLE).status_code == 201
    for _ in range(3):
        loop.tick()  # the main graph commits epochs (it has no actors)
    body = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "snapshot"}
    r = client.post("/v1/jobs", json=body | {"parallelism": parallelism})
    assert r.status_code == 202, r.text
    return r.json()  # type: ignore[no-any-return]


def graph_of_job(db: Database, job: int) -> Graph | None:
    with db.transaction() as s:
        return s.execute(select(Graph).where(Graph.job_id == job)).scalar_one_or_none()


def main_closed_epochs(db: Database) -> list[int]:
    return [b.prev_epoch for b in barriers_of(db, 1) if b.prev_epoch > 0]


def test_a_snapshot_backfill_runs_apart_then_merges(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    w = FakeWorker(client).register()
    job = snapshot_job(client, loop, parallelism=2)
    snapshot_epoch = int(job["snapshot_epoch"])
    assert snapshot_epoch == committed_epoch(db) > 0
    graph = graph_of_job(db, job["id"])
    assert graph is not None and graph.kind == "creating"
    assert job["committed_epoch"] == "0"  # the job's own graph

    # phase 1: fake epochs, far below the snapshot epoch, each telling the upstream's epoch
    loop.tick()
    first = collect(w, "consuming")
    assert [(b["prev"], b["curr"], b["kind"]) for b in first] == [(0, 1 << 16, "initial")] * 2
    assert {b["upstream_epoch"] for b in first} == {committed_epoch(db)}
    loop.tick()
    second = collect(w, "consumed")  # the snapshot is read to its end in this epoch
    assert {(b["prev"], b["curr"]) for b in second} == {(1 << 16, fake_epoch_after(1 << 16))}
    assert client.get(f"/v1/jobs/{job['id']}/progress").json()["phase"] == "snapshot"

    # the end of the snapshot, followed in the same tick by the upstream's epochs one per
    # barrier, several per tick
    loop.tick()
    last_fake = fake_epoch_after(1 << 16)
    # (the last barrier, which catches up, stays uncollected: no merge before the
    # recovery below)
    ending = collect(w, "consumed", before=graph_current(db, 1))
    assert [(b["prev"], b["curr"]) for b in ending if b["prev"] == last_fake] == [
        (last_fake, snapshot_epoch)
    ] * 2
    assert {b["prev"] for b in ending} > {last_fake}, "no replay after the snapshot's end"
    for _ in range(3):
        loop.tick()  # the main graph goes on meanwhile: more epochs to replay
    loop.tick()
    replay = [b for b in ending if b["prev"] != last_fake] + collect(w, "consumed")
    chain = sorted({(b["prev"], b["curr"]) for b in replay})
    replayed = [e for e in main_committed_epochs(db) if e > snapshot_epoch]
    assert chain[0][0] == snapshot_epoch
    # the upstream changed nothing: each barrier went to the latest committed epoch
    visited = [c for _, c in chain][:-1]
    assert visited == [e for e in replayed if e in visited] and visited[-1] == replayed[-1]
    assert all(p == c for (_, c), (p, _) in zip(chain, chain[1:], strict=False))
    main_after = {b.prev_epoch: b.curr_epoch for b in barriers_of(db, 1)}
    with db.transaction() as s:
        main = s.get(Graph, 1)
        assert main is not None
        # the last barrier: caught up, it opens the main epoch after the committed one
        assert chain[-1] == (main.committed_epoch, main_after[main.committed_epoch])
        assert all(b["kind"] == "checkpoint" for b in replay)
        assert s.execute(select(EpochPin).where(EpochPin.holder == f"job:{job['id']}")).first()

    # recovery after the snapshot: it starts again at the epoch after the committed one
    g = graph_of_job(db, job["id"])
    assert g is not None
    committed = g.committed_epoch
    assert (
        client.post(f"/v1/workers/{w.worker_id}/failures", json={"message": "boom"}).status_code
        == 202
    )
    loop.tick()
    again = collect(w, "consumed")
    assert {(b["prev"], b["kind"]) for b in again} >= {(committed, "initial")}
    initial = next(b for b in again if b["kind"] == "initial")
    assert initial["curr"] in [*main_closed_epochs(db), graph_current(db, 1)]

    # caught up and committed: the main graph's next barrier carries the actors on
    for _ in range(20):
        loop.tick()
        collect(w, "consumed")
        if graph_of_job(db, job["id"]) is None:
            break
    assert graph_of_job(db, job["id"]) is None, "never merged"
    view = client.get(f"/v1/jobs/{job['id']}").json()
    assert view["state"] == "created" and int(view["finished_epoch"]) >= committed
    loop.tick()
    moved = w.poll()
    assert {a["graph_id"] for a in moved} == {1}
    assert all(a["barriers"] and a["restore"] is None for a in moved)  # they keep their state
    with db.transaction() as s:
        assert not s.execute(select(EpochPin).where(EpochPin.holder == f"job:{job['id']}")).first()


def test_the_replay_skips_the_upstream_epochs_that_changed_nothing(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    w = FakeWorker(client).register()
    job = snapshot_job(client, loop, parallelism=1)
    snapshot_epoch = int(job["snapshot_epoch"])
    # the upstream's epoch index, which the leader builds once a job reads it: the replay
    # probes it for the epochs with changes (without it, every epoch counts as changed)
    assert loop.indexer.run_once() != []
    loop.tick()
    collect(w, "consuming")
    # while the snapshot is read the upstream commits six epochs, a row in every other
    written = []
    for i in range(6):
        if i % 2 == 0:
            ops = [{"op": "insert", "row": {"id": i, "v": "x"}}]
            r = client.post("/v1/tables/orders/dml", json={"ops": ops})
            assert r.status_code == 200, r.text
            written.append(int(r.json()["epoch"]))
        loop.tick()
    committed = [e for e in main_committed_epochs(db) if e > snapshot_epoch]
    assert set(written) <= set(committed) and len(committed) >= 6
    replay: list[dict[str, Any]] = []
    for _ in range(10):
        collect(w, "consumed")
        loop.tick()
        replay += [b for b in collect(w, "consumed") if b["prev"] >= snapshot_epoch]
        if graph_of_job(db, job["id"]) is None:
            break
    assert graph_of_job(db, job["id"]) is None, "not merged"
    chain = sorted({(b["prev"], b["curr"]) for b in replay})
    assert all(p == c for (_, c), (p, _) in zip(chain, chain[1:], strict=False))
    visited = [p for p, _ in chain]
    # each epoch written in is replayed at its own barrier; one that changed nothing is
    # skipped when a later one has changes (else the replay stops at the committed one)
    assert visited[0] == snapshot_epoch and set(written) <= set(visited)
    between = [e for e in committed if written[0] < e < written[-1] and e not in written]
    assert len(between) >= 2 and not set(between) & set(visited), (visited, written)


def graph_current(db: Database, graph_id: int) -> int:
    with db.transaction() as s:
        g = s.get(Graph, graph_id)
        assert g is not None
        return g.current_epoch


def test_a_job_asks_for_a_round_of_its_own_graph_only(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """Creating or steering a snapshot job asks the barrier loop for a round of creating
    graphs only: an upstream barrier out of its cadence, injected with the job's first
    one, reached the upstream's actors just as the job's start loaded the workers (the
    slowest upstream barriers of bench_coupling's throttled phase 1). A job of the main
    graph asks for a main round."""
    client, loop = manual
    signal = client.app.state.ctx.signal  # the API's, which a leading loop would wait on
    FakeWorker(client).register()
    job = snapshot_job(client, loop, parallelism=2)
    asked = signal.wait_for_barrier_request(0)
    assert asked == {"creating"}
    upstream = [b.curr_epoch for b in barriers_of(db)]
    graph = graph_of_job(db, job["id"])
    assert graph is not None
    loop.tick(asked)  # the round the job asked for
    assert [b.kind for b in barriers_of(db, graph.id)] == ["initial"]
    assert [b.curr_epoch for b in barriers_of(db)] == upstream
    assert client.post(f"/v1/jobs/{job['id']}/pause").status_code == 200
    assert signal.wait_for_barrier_request(0) == {"creating"}

    body = {"name": "mv2", "upstream": {"table": "orders"}, "backfill": "arrangement"}
    assert client.post("/v1/jobs", json=body).status_code == 202
    assert signal.wait_for_barrier_request(0) == {"main"}


def test_a_snapshot_job_needs_a_committed_upstream_epoch(
    manual: tuple[TestClient, MetaLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It waits (bounded) for the first commit; with no barrier loop running, none comes."""
    client, _ = manual
    monkeypatch.setattr(jobs_usecase, "FIRST_COMMIT_WAIT_S", 0.5)
    assert client.post("/v1/tables", json=TABLE).status_code == 201
    body = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "snapshot"}
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 409, r.text
    assert "no epoch was committed within" in r.json()["error"]["message"]
    assert client.get("/v1/jobs").json()["jobs"] == []  # nothing half-created


def test_cancelling_a_snapshot_job_removes_its_graph(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    FakeWorker(client).register()
    assert client.post("/v1/tables", json=TABLE).status_code == 201
    for _ in range(3):
        loop.tick()
    body = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "snapshot"}
    job = client.post("/v1/jobs", json=body).json()
    loop.tick()  # the creating graph's first barrier
    assert graph_of_job(db, job["id"]) is not None
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 204
    with db.transaction() as s:
        assert [g.kind for g in s.execute(select(Graph)).scalars()] == ["main"]
        assert not s.execute(select(EpochPin)).first()
    assert client.get("/v1/tables/mv").status_code == 404
    loop.tick()  # the loop goes on without it


def collect_reporting(w: FakeWorker, report: dict[str, Any], most: int = 1) -> None:
    """Collect the first ``most`` ready barriers of each actor, every vnode consumed and
    ``report`` besides (the job replays slowly: it stays behind the upstream)."""
    for a in w.poll():
        vnodes = [v for lo, hi in a["vnodes"] for v in range(lo, hi)]
        for b in a["barriers"][:most]:
            progress = {
                "vnodes": [
                    {"vnode": v, "state": "consumed", "current_pos": None, "row_count": 1}
                    for v in vnodes
                ]
            } | report
            assert w.collect(a["actor_id"], b, progress=progress).status_code == 200


@pytest.fixture
def one_at_a_time(db: Database, fresh_db_url: str) -> Iterator[tuple[TestClient, MetaLoop]]:
    """As ``manual``, with one barrier in flight per graph: a replay goes out an epoch at
    a time, so its last barrier (whose merge hold would hold the upstream too) waits."""
    with manual_api(db, fresh_db_url, max_pending_barriers=1) as api:
        yield api


def test_a_lagging_log_store_replay_holds_the_upstream_back(
    one_at_a_time: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = one_at_a_time
    w = FakeWorker(client).register()
    snapshot_job(client, loop, parallelism=1)
    loop.tick()
    collect(w, "consumed")
    loop.tick()
    collect(w, "consumed")  # {last fake, snapshot epoch}: the log store starts
    main_before = graph_current(db, 1)
    # the job replays the epoch after the snapshot next, with a cap the lag reaches (a
    # cap of 0 holds an upstream at or past that epoch, whatever the clock did)
    loop.tick()
    collect_reporting(w, {"phase": "log_store", "max_pending_epoch_lag_ms": 0})
    held = graph_current(db, 1)
    with db.transaction() as s:
        main = s.get(Graph, 1)
        assert main is not None
        assert merge_ceiling(s, main) is None  # what holds it is the lag cap alone
    loop.tick()
    assert graph_current(db, 1) == held > main_before  # held back: no new upstream epoch
    loop.tick()
    assert graph_current(db, 1) == held  # still held while the job does not move
    # once the job has caught up, the upstream goes on
    for _ in range(10):
        caught_up = committed_epoch(db)
        collect_reporting(
            w,
            {"phase": "log_store", "consumed_epoch": caught_up, "max_pending_epoch_lag_ms": 1_000},
            most=100,
        )
        loop.tick()
        if graph_current(db, 1) > held:
            break
    assert graph_current(db, 1) > held


def _busy_main_and_a_snapshot_job(
    client: TestClient, loop: MetaLoop, db: Database, w: FakeWorker, *, replayed: bool = True
) -> tuple[int, int, int]:
    """An arrangement job keeps the main graph's barriers waiting for its actor; a
    snapshot job replays the log store. Returns (job id, busy actor, snapshot actor)
    once the snapshot job sent its last barrier (and, if ``replayed``, committed all
    the others), the main graph still busy."""
    assert client.post("/v1/tables", json=TABLE).status_code == 201
    for _ in range(3):
        loop.tick()
    busy = {"name": "busy", "upstream": {"table": "orders"}, "backfill": "arrangement"}
    r = client.post("/v1/jobs", json=busy | {"parallelism": 1})
    assert r.status_code == 202, r.text
    busy_job = r.json()["id"]
    snap = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "snapshot"}
    r = client.post("/v1/jobs", json=snap | {"parallelism": 1})
    assert r.status_code == 202, r.text
    job = r.json()
    (busy_actor,) = [a.id for a in actors_of(db, busy_job)]
    (snap_actor,) = [a.id for a in actors_of(db, job["id"])]
    for _ in range(20):  # everyone keeps up until the log store starts
        loop.tick()
        collect(w, "consumed", only={busy_actor})
        # (the replay that follows the barrier ending the snapshot in its tick waits)
        collect(w, "consumed", only={snap_actor}, before=int(job["snapshot_epoch"]) + 1)
        g = graph_of_job(db, job["id"])
        assert g is not None
        if g.current_epoch >= int(job["snapshot_epoch"]):
            break
    for _ in range(20):  # now only the snapshot job collects: the main graph is busy
        loop.tick()
        g = graph_of_job(db, job["id"])
        assert g is not None
        if g.current_epoch > committed_epoch(db):
            break  # the last barrier is out
        collect(w, "consumed", only={snap_actor})
    assert g is not None
    if replayed:
        collect(w, "consumed", only={snap_actor}, before=g.current_epoch)  # all but the last
    loop.tick()
    return job["id"], busy_actor, snap_actor


def main_in_flight(db: Database) -> list[tuple[int, int]]:
    return [(b.prev_epoch, b.curr_epoch) for b in barriers_of(db) if b.state != "committed"]


@pytest.mark.parametrize("replayed", [True, False], ids=["last barrier left", "replay left"])
def test_a_snapshot_job_joins_the_main_graph_at_its_barriers_in_flight(
    manual: tuple[TestClient, MetaLoop], db: Database, replayed: bool
) -> None:
    """Once a job's last barrier is out, the upstream waits for it and for the replay
    still in flight before it (or it would chase the upstream for ever, one round trip
    of its worker behind)."""
    client, loop = manual
    w = FakeWorker(client).register()
    job, busy_actor, snap_actor = _busy_main_and_a_snapshot_job(
        client, loop, db, w, replayed=replayed
    )
    g = graph_of_job(db, job)
    assert g is not None
    joins_at = g.current_epoch  # the main epoch after the committed one
    committed = committed_epoch(db)
    last = [b for b in barriers_of(db, g.id) if b.curr_epoch == joins_at]
    assert [(b.prev_epoch, b.state) for b in last] == [(committed, "inflight")]
    in_flight = main_in_flight(db)
    assert in_flight and in_flight[0][0] == joins_at
    # while the job's last barrier is out, the main graph injects nothing more: on a
    # busy worker its barriers would queue ahead of the job's and outlast the hold
    loop.tick()
    assert main_in_flight(db) == in_flight

    # the busy actor collects everything: the main graph must not commit the epoch the
    # job is about to join at (its last barrier is all it has left), or the job would
    # miss it
    collect(w, "consumed", only={busy_actor})
    loop.tick()
    assert committed_epoch(db) == committed < joins_at
    assert graph_of_job(db, job) is not None

    # the job's last barrier commits: it merges, and its actor collects every main
    # barrier from the one closing the epoch it joined at, keeping its state
    collect(w, "consumed", only={snap_actor})
    assert client.get(f"/v1/jobs/{job}/progress").json()["phase"] == "finishing"
    loop.tick()
    assert graph_of_job(db, job) is None, "never merged"
    view = client.get(f"/v1/jobs/{job}").json()
    assert view["state"] == "created" and view["finished_epoch"] == str(committed)
    (moved,) = [a for a in w.poll() if a["actor_id"] == snap_actor]
    assert moved["graph_id"] == 1 and moved["restore"] is None
    assert [(b["prev"], b["curr"]) for b in moved["barriers"]] == main_in_flight(db)
    assert len(main_in_flight(db)) > len(in_flight)  # merged: the upstream goes on
    assert main_in_flight(db)[0][0] == joins_at
    assert committed_epoch(db) == committed  # it waits for the job's actor now
    collect(w, "consumed")
    assert committed_epoch(db) > joins_at


def test_once_the_hold_ended_the_job_replays_on_and_merges_later(
    manual: tuple[TestClient, MetaLoop], db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upstream waits for a job's last barrier no longer than the hold."""
    client, loop = manual
    w = FakeWorker(client).register()
    job, busy_actor, snap_actor = _busy_main_and_a_snapshot_job(client, loop, db, w)
    g = graph_of_job(db, job)
    assert g is not None
    joins_at = g.current_epoch
    held = main_in_flight(db)
    monkeypatch.setattr(barriers, "MERGE_HOLD_MS", 0)
    loop.tick()
    assert graph_current(db, 1) > max(c for _, c in held)  # the main graph injects again
    collect(w, "consumed", only={busy_actor})
    assert committed_epoch(db) >= joins_at  # the upstream went past: no merge there
    collect(w, "consumed", only={snap_actor})
    loop.tick()
    assert graph_of_job(db, job) is not None  # not merged at joins_at: it replays on
    for _ in range(20):  # it replays the upstream's epochs again, then merges
        collect(w, "consumed", only={snap_actor})
        loop.tick()
        if graph_of_job(db, job) is None:
            break
    assert graph_of_job(db, job) is None, "never merged"
    assert int(client.get(f"/v1/jobs/{job}").json()["finished_epoch"]) >= joins_at


def test_a_late_collect_of_an_earlier_incarnation_is_stale_though_its_epochs_came_again(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """A creating graph recovers to the epoch after its committed one, so two recoveries
    in a row hand out the very same barrier. A collect of the first one that arrives
    after the second (a worker retrying through a control-plane restart) carries
    progress whose rows the second recovery rolled back: it must not count."""
    client, loop = manual
    w = FakeWorker(client).register()
    job = snapshot_job(client, loop, parallelism=1)
    loop.tick()
    collect(w, "consuming")
    loop.tick()
    collect(w, "consuming")  # commits the first fake epoch
    graph = graph_of_job(db, job["id"])
    assert graph is not None and graph.committed_epoch == 1 << 16

    def recover() -> dict[str, Any]:
        r = client.post(f"/v1/workers/{w.worker_id}/failures", json={"message": "boom"})
        assert r.status_code == 202, r.text
        loop.tick()
        [a] = w.poll()
        assert a["barriers"][0]["kind"] == "initial"
        return a

    zombie = recover()
    present = recover()
    [old], [new] = zombie["barriers"], present["barriers"]
    assert (old["prev"], old["curr"]) == (new["prev"], new["curr"]) == (1 << 16, 2 << 16)
    assert present["recovery_seq"] > zombie["recovery_seq"]

    skipped = {"vnodes": [{"vnode": v, "state": "consumed", "row_count": 999} for v in range(8)]}
    r = w.collect(zombie["actor_id"], old, recovery_seq=zombie["recovery_seq"], progress=skipped)
    err = assert_error(r, 409, ErrorCode.STALE_COLLECT)
    assert err["details"]["recovery_seq"] == present["recovery_seq"]
    assert collect(w, "consuming")  # the present incarnation's collect is accepted
    loop.tick()
    collect(w, "consuming")
    graph = graph_of_job(db, job["id"])
    assert graph is not None and graph.committed_epoch == 2 << 16
    progress = client.get(f"/v1/jobs/{job['id']}/progress").json()
    assert {v["state"] for v in progress["vnodes"]} == {"consuming"}
    assert progress["rows"] == 8


def test_a_pause_not_injected_yet_follows_a_merging_job_into_the_main_graph(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """A pause asked while a snapshot job's last barrier is out is still pending when the
    job merges: it moves with the job's actor into the main graph (its creating graph,
    deleted, would drop it) and names that actor only, not the main graph's other job."""
    client, loop = manual
    w = FakeWorker(client).register()
    job, busy_actor, snap_actor = _busy_main_and_a_snapshot_job(client, loop, db, w)
    assert client.post(f"/v1/jobs/{job}/pause").json()["paused"] is True
    collect(w, "consumed", only={busy_actor})
    collect(w, "consumed", only={snap_actor})
    loop.tick()
    assert graph_of_job(db, job) is None, "never merged"
    loop.tick()
    got = [b for a in w.poll() if a["actor_id"] == snap_actor for b in a["barriers"]]
    assert [b["mutation"] for b in got if b["mutation"]] == [{"pause": [snap_actor]}]
    pauses = [b.mutation for b in barriers_of(db, 1) if b.mutation and "pause" in b.mutation]
    assert pauses == [{"pause": [snap_actor]}]


def test_phase_1_goes_a_barrier_a_second_at_short_intervals(
    db: Database, fresh_db_url: str
) -> None:
    """At 100 ms barriers the loop's regular rounds give a snapshot job's phase 1 one
    barrier in ten (it needs no upstream cadence, and each costs its reads); a round
    asked for (the reads ran out, a pause) injects one at once."""
    with manual_api(db, fresh_db_url, barrier_interval_ms=100) as (client, loop):
        w = FakeWorker(client).register()
        job = snapshot_job(client, loop, parallelism=1)
        g = graph_of_job(db, job["id"])
        assert g is not None
        loop.tick()  # the initial barrier
        collect(w, "consuming")
        fake = barriers_of(db, g.id)
        for _ in range(10):
            loop.tick(CREATING, regular=True)
            collect(w, "consuming")
        paced = barriers_of(db, g.id)
        assert len(paced) - len(fake) == 1  # one in ten regular rounds
        loop.tick(CREATING)  # asked for: at once
        assert len(barriers_of(db, g.id)) == len(paced) + 1


def test_a_creating_graph_in_phase_1_costs_a_round_not_due_for_it_no_statement(
    db: Database, fresh_db_url: str
) -> None:
    """At 100 ms barriers nine regular rounds in ten are not due for phase 1: they leave a
    creating graph in phase 1 alone, without a transaction for it; the due one and a
    round asked for still inject its barrier."""
    with manual_api(db, fresh_db_url, barrier_interval_ms=100) as (client, loop):
        w = FakeWorker(client).register()
        job = snapshot_job(client, loop, parallelism=1)
        loop.tick()  # the initial barrier of the creating graph
        w.collect_all()
        loop.tick(CREATING, regular=True)  # the due round: a fake epoch
        w.collect_all()
        g = graph_of_job(db, job["id"])
        assert g is not None
        before = len(barriers_of(db, g.id))
        with statements(db) as seen:
            for _ in range(9):
                loop.tick(CREATING, regular=True)
        assert seen["loop"] == [] and seen["engine"] == [], seen
        assert len(seen["readers"]) == 9  # the graphs listed, once a round
        assert len(barriers_of(db, g.id)) == before
        loop.tick(CREATING, regular=True)  # due again
        assert len(barriers_of(db, g.id)) == before + 1
        w.collect_all()
        loop.tick(CREATING)  # asked for: at once
        assert len(barriers_of(db, g.id)) == before + 2


def test_an_actor_done_reading_asks_for_the_end_of_phase_1_only_with_the_others(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """An actor that read its share of the snapshot while another still reads asks for
    no round (each one asked for gave it another barrier at once, a barrier per round
    trip until the last actor was done); the last one's collect asks for the round that
    ends phase 1."""
    client, loop = manual
    w = FakeWorker(client).register()
    snapshot_job(client, loop, parallelism=2)
    loop.tick()
    collect(w, "consuming")  # the initial barrier
    loop.tick()
    signal = client.app.state.ctx.signal  # type: ignore[attr-defined]
    signal.wait_for_barrier_request(0)  # forget the rounds asked for so far
    done = {"phase": "snapshot", "finished_snapshot": True}
    first, second = sorted(a["actor_id"] for a in w.poll())
    for actor, report in ((first, done), (second, {"phase": "snapshot"})):
        for a in w.poll():
            if a["actor_id"] != actor:
                continue
            vnodes = [v for lo, hi in a["vnodes"] for v in range(lo, hi)]
            state = "consumed" if report.get("finished_snapshot") else "consuming"
            progress = {
                "vnodes": [
                    {"vnode": v, "state": state, "current_pos": None, "row_count": 1}
                    for v in vnodes
                ]
            } | report
            for b in a["barriers"]:
                assert w.collect(actor, b, progress=progress).status_code == 200
    assert "creating" not in signal.wait_for_barrier_request(0)
    loop.tick()
    collect_reporting(w, done)  # now both are done: the commit ends their reading
    assert "creating" in signal.wait_for_barrier_request(0)
