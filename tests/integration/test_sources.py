"""Sources over HTTP against a real Kafka-protocol broker (librdkafka's mock cluster),
and the meta's shared source with scripted watermarks: offsets fixed per epoch within
the rate limit, new partitions handed to the jobs' actors, rollback on recovery."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from connectors.kafka import KafkaClient, KafkaSpec
from service.catalog.models import Actor, Source, SourceOffsets
from service.db import Database
from service.meta import barriers, recovery
from service.meta.loop import MetaLoop
from service.meta.sources import SourceWatcher
from service.settings import Settings
from tests.integration.test_health_and_errors import assert_error
from tests.kit.auth import api_client
from tests.kit.kafka import MOCK_PARTITIONS, MockKafka
from tests.kit.meta import FakeWorker

pytestmark = pytest.mark.kafka


def spec(broker: MockKafka, **extra: Any) -> dict[str, Any]:
    return {
        "name": "clicks",
        "kafka": {"bootstrap_servers": broker.bootstrap, "topic": "clicks"},
        "columns": [{"name": "user_id", "type": "bigint"}, {"name": "url", "type": "text"}],
    } | extra


def test_create_get_list_drop(client: TestClient, kafka: MockKafka) -> None:
    kafka.produce("clicks", [(p, {"user_id": p}) for p in range(MOCK_PARTITIONS)] * 3)
    r = client.post("/v1/sources", json=spec(kafka, rate_limit=100))
    assert r.status_code == 201, r.text
    src = r.json()
    assert [c["name"] for c in src["columns"]] == ["user_id", "url", "_partition", "_offset"]
    assert src["primary_key"] == ["_partition", "_offset"]
    # the shared source starts at the topic's end; jobs backfill what is before
    assert src["start_offsets"] == {str(p): 3 for p in range(MOCK_PARTITIONS)}
    assert client.get("/v1/sources/clicks").json() == src
    assert [s["name"] for s in client.get("/v1/sources").json()["sources"]] == ["clicks"]
    assert_error(client.post("/v1/sources", json=spec(kafka)), 409, "conflict")
    assert client.delete("/v1/sources/clicks").status_code == 204
    assert_error(client.get("/v1/sources/clicks"), 404, "not_found")


def test_secret_properties_are_stored_and_never_shown(
    client: TestClient, kafka: MockKafka, db: Database
) -> None:
    kafka.produce("clicks", [(0, {"user_id": 1})])
    secrets = {
        "sasl.username": "svc",
        "sasl.password": "hunter2-sasl",
        "ssl.key.password": "hunter2-key",
        "ssl.keystore.password": "hunter2-store",
    }
    props = {"client.id": "backfill-test", **secrets}
    body = spec(kafka) | {"kafka": spec(kafka)["kafka"] | {"properties": props}}
    created = client.post("/v1/sources", json=body)
    assert created.status_code == 201, created.text
    shown = {"client.id": "backfill-test"} | {k: "***" for k in secrets}
    assert created.json()["kafka"]["properties"] == shown
    assert client.get("/v1/sources/clicks").json()["kafka"]["properties"] == shown
    answers = [
        created.text,
        client.get("/v1/sources").text,
        client.get("/v1/sources/clicks").text,
        client.get("/v1/events", params={"follow": "false"}).text,
    ]
    assert not any("hunter2" in a or '"svc"' in a for a in answers)
    with db.transaction() as s:  # stored as given: the workers' clients need them
        stored = s.execute(select(Source.kafka).where(Source.name == "clicks")).scalar_one()
    assert stored["properties"] == props


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"columns": [{"name": "x", "type": "uuid"}]}, "columns[0].type"),
        ({"columns": [{"name": "_offset", "type": "bigint"}]}, "columns[0].name"),
        (
            {"columns": [{"name": "a", "type": "int"}, {"name": "a", "type": "int"}]},
            "columns[1].name",
        ),
        ({"name": "Robert'); DROP TABLE jobs;--"}, "name"),
    ],
)
def test_bad_sources_are_422_and_write_nothing(
    client: TestClient, kafka: MockKafka, change: dict[str, Any], field: str
) -> None:
    err = assert_error(client.post("/v1/sources", json=spec(kafka, **change)), 422, "invalid")
    assert err["details"]["field"] == field
    assert client.get("/v1/sources").json()["sources"] == []


def test_kafka_problems_are_clear_errors(client: TestClient, kafka: MockKafka) -> None:
    bad_topic = spec(kafka, kafka={"bootstrap_servers": kafka.bootstrap, "topic": "a b"})
    assert assert_error(client.post("/v1/sources", json=bad_topic), 422, "invalid")
    reserved = spec(
        kafka,
        kafka={
            "bootstrap_servers": kafka.bootstrap,
            "topic": "clicks",
            "properties": {"group.id": "mine"},
        },
    )
    assert (
        "group.id"
        in assert_error(client.post("/v1/sources", json=reserved), 422, "invalid")["message"]
    )
    missing = spec(kafka, kafka={"bootstrap_servers": kafka.bootstrap, "topic": "nope"})
    err = assert_error(client.post("/v1/sources", json=missing), 422, "kafka_unavailable")
    assert "nope" in err["message"]
    nobody = spec(kafka, kafka={"bootstrap_servers": "127.0.0.1:1", "topic": "clicks"})
    err = assert_error(client.post("/v1/sources", json=nobody), 422, "kafka_unavailable")
    assert "unreachable" in err["message"]
    assert client.get("/v1/sources").json()["sources"] == []


def test_jobs_on_sources_validate_kind_key_and_parallelism(
    client: TestClient, kafka: MockKafka
) -> None:
    kafka.produce("clicks", [(0, {"user_id": 1})])
    assert client.post("/v1/sources", json=spec(kafka)).status_code == 201
    job = {"name": "per_user", "upstream": {"source": "clicks"}}
    err = assert_error(
        client.post("/v1/jobs", json=job | {"backfill": "arrangement"}), 422, "invalid"
    )
    assert "source" in err["message"]
    err = assert_error(
        client.post("/v1/jobs", json=job | {"columns": ["user_id", "_partition"]}), 422, "invalid"
    )
    assert "_offset" in err["message"]
    err = assert_error(client.post("/v1/jobs", json=job | {"parallelism": 5}), 422, "invalid")
    assert "partitions" in err["message"]
    both = {"name": "x", "upstream": {"source": "clicks", "table": "t"}}
    assert_error(client.post("/v1/jobs", json=both), 422, "invalid")
    r = client.post("/v1/jobs", json=job | {"parallelism": 4})
    assert r.status_code == 202, r.text
    assert r.json()["kind"] == "source" and r.json()["upstream"]["source"] == "clicks"
    assert_error(client.delete("/v1/sources/clicks"), 409, "conflict")
    assert client.delete(f"/v1/jobs/{r.json()['id']}").status_code == 204
    assert client.delete("/v1/sources/clicks").status_code == 204


class ScriptedProbe:
    """The broker side of the watcher, scripted: partition -> (low, high)."""

    marks: dict[int, tuple[int, int]] = {}

    def __init__(self, spec: KafkaSpec) -> None:
        self.spec = spec

    def watermarks(self) -> dict[int, tuple[int, int]]:
        return dict(ScriptedProbe.marks)

    def close(self) -> None:
        pass


def test_the_shared_source_advances_per_epoch_and_hands_out_new_partitions(
    db: Database, fresh_db_url: str, kafka: MockKafka
) -> None:
    kafka.produce("clicks", [(p, {"user_id": p}) for p in range(MOCK_PARTITIONS)])
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False, worker_lease_ms=60_000)
    watcher = SourceWatcher(db, 1.0, probe_factory=ScriptedProbe)
    loop = MetaLoop(settings, db, watcher=watcher)
    from service.api.app import create_app

    with api_client(create_app(settings, db)) as client:
        worker = FakeWorker(client).register()
        r = client.post("/v1/sources", json=spec(kafka, rate_limit=20_000))
        assert r.status_code == 201, r.text
        job = client.post(
            "/v1/jobs",
            json={"name": "per_user", "upstream": {"source": "clicks"}, "parallelism": 2},
        ).json()["id"]
        ScriptedProbe.marks = {p: (0, 1) for p in range(MOCK_PARTITIONS)}
        watcher.refresh()
        loop.tick()  # adds the actors
        ScriptedProbe.marks = {p: (0, 1 + 10_000 * (p + 1)) for p in range(MOCK_PARTITIONS)}
        watcher.refresh()
        loop.tick()
        ranges = [b["source_ranges"] for a in worker.poll() for b in a["barriers"]]
        assert ranges and all(set(r) == {"0", "1", "2", "3"} for r in ranges)
        first, second = ranges[0], ranges[1]
        assert all(start == end == 1 for start, end in first.values())  # nothing new yet
        # within the rate limit: 20k/s over the epoch's length, shared by 4 partitions
        moved = [end - start for start, end in second.values()]
        assert all(0 < m < 10_000 for m in moved), second
        assert all(start == 1 for start, _ in second.values())
        loop.tick()  # closes the epoch the source moved in
        worker.collect_all()
        committed = int(client.get(f"/v1/jobs/{job}").json()["committed_epoch"])
        ScriptedProbe.marks = {p: (0, 1 + 10_000 * (p + 1)) for p in range(MOCK_PARTITIONS)}

        # a partition appears: read from its first offset, handed to the actor with fewest
        ScriptedProbe.marks[4] = (0, 5)  # the others stay where they are
        watcher.refresh()
        loop.tick()
        last = [b for a in worker.poll() for b in a["barriers"]][-1]
        assert last["mutation"]["splits"] in (
            {"1": ["0", "1", "4"], "2": ["2", "3"]},
            {"1": ["0", "1"], "2": ["2", "3", "4"]},
        )
        assert last["source_ranges"]["4"] == [0, 5]
        with db.transaction() as s:
            src = s.execute(select(Source)).scalar_one()
            assert src.start_offsets["4"] == 0
            owned = sorted(x for a in s.execute(select(Actor)).scalars() for x in a.splits)
            assert owned == ["0", "1", "2", "3", "4"]

        # recovery forgets where the source went after the committed epoch
        with db.transaction() as s:
            recovery.request_recovery(s, 1, "test")
        loop.tick()
        with db.transaction() as s:
            epochs = s.execute(select(SourceOffsets.epoch)).scalars().all()
            assert epochs and max(epochs) <= committed  # the moved epoch stays, the rest went


def test_a_split_change_dropping_a_split_trims_its_progress_and_the_totals(
    db: Database, fresh_db_url: str, kafka: MockKafka
) -> None:
    """A split change drops split 3 (as a source losing a partition would) and moves
    split 1 to the other actor: at the next commit the job's progress and its totals
    count splits 0, 1 and 2 only; the moved split keeps its committed row (its new
    owner restores from it), as the seed trims only the state of dropped splits."""
    kafka.produce("clicks", [(p, {"user_id": p}) for p in range(MOCK_PARTITIONS)])
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False, worker_lease_ms=60_000)
    watcher = SourceWatcher(db, 1.0, probe_factory=ScriptedProbe)
    loop = MetaLoop(settings, db, watcher=watcher)
    from service.api.app import create_app

    consumed = {"0": 10, "1": 20, "2": 30, "3": 40}
    with api_client(create_app(settings, db)) as client:
        worker = FakeWorker(client).register()
        assert client.post("/v1/sources", json=spec(kafka)).status_code == 201
        job = client.post(
            "/v1/jobs",
            json={"name": "per_user", "upstream": {"source": "clicks"}, "parallelism": 2},
        ).json()["id"]
        ScriptedProbe.marks = {p: (0, 1) for p in range(MOCK_PARTITIONS)}
        watcher.refresh()
        owned: dict[int, list[str]] = {}  # actor -> its splits, as its executor has them

        def epoch() -> None:
            """A barrier, collected by every actor with its splits' progress (the closed
            epoch's: a split change applies after the report)."""
            loop.tick()
            for a in worker.poll():
                actor = a["actor_id"]
                mine = owned.setdefault(actor, [str(x) for x in a["splits"]])
                for b in a["barriers"]:
                    rows = [
                        {"split": x, "state": "backfilling", "offset": 0,
                         "num_consumed_rows": consumed[x], "target_offset": 9}
                        for x in mine
                    ]  # fmt: skip
                    r = worker.collect(actor, b, progress={"splits": rows})
                    assert r.status_code == 200, r.text
                    change = (b.get("mutation") or {}).get("splits") or {}
                    mine = owned[actor] = list(change.get(str(actor), mine))

        def progress() -> tuple[list[str], int]:
            p = client.get(f"/v1/jobs/{job}/progress").json()
            return [x["split"] for x in p["splits"]], p["rows"]

        for _ in range(3):
            epoch()
        assert progress() == (["0", "1", "2", "3"], 100)
        with db.transaction() as s:
            first, second = s.execute(
                select(Actor).where(Actor.job_id == job).order_by(Actor.id)
            ).scalars()
            assert (first.splits, second.splits) == (["0", "1"], ["2", "3"])
            first.splits, second.splits = ["0"], ["1", "2"]
            change = {str(first.id): ["0"], str(second.id): ["1", "2"]}
            barriers.enqueue_mutation(s, 1, {"splits": change})
        epoch()  # the change's barrier: its reports still hold split 3, its commit trims it
        assert progress() == (["0", "1", "2"], 60)
        for _ in range(2):
            epoch()
        assert progress() == (["0", "1", "2"], 60)
        with db.transaction() as s:
            kept = s.execute(
                text("SELECT consumed_rows FROM job_progress WHERE job_id = :j"), {"j": job}
            ).scalar_one()
            assert kept == 60


def test_a_read_cut_short_by_its_limit_ends_after_its_last_message(kafka: MockKafka) -> None:
    """Each partition is one large stored batch, so a fetch hands the reader far more
    messages than a rate-limited read keeps: the read's end is still right after the
    last message it kept. (It once took the consumer's position, past the dropped
    ones, for a gap without messages: a source backfill then skipped them for good.)"""
    kafka.load("bulk", [(i % MOCK_PARTITIONS, {"i": i}) for i in range(MOCK_PARTITIONS * 2_000)])
    client = KafkaClient(KafkaSpec(kafka.bootstrap, "bulk", {}))
    try:
        for start, limit in ((None, 300), (500, 1_000), (1_990, 50)):
            got = client.scan_ranges({p: (start, 2_000, limit) for p in range(MOCK_PARTITIONS)})
            first = start or 0
            for p, scan in got.items():
                offsets = [m.offset for m in scan.messages]
                kept = min(limit, 2_000 - first)
                assert offsets == list(range(first, first + kept)), p
                assert scan.end == first + kept, (p, start, limit)
    finally:
        client.close()


def test_the_watcher_looks_for_sources_at_the_interval_once_one_exists(
    db: Database, fresh_db_url: str, kafka: MockKafka
) -> None:
    """With no source the watcher looks every ``NO_SOURCE_WAIT_S`` (ten times fewer
    looks at 100 ms barriers); once a source exists, at every barrier interval."""
    from service.meta.sources import NO_SOURCE_WAIT_S

    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    watcher = SourceWatcher(db, 0.1, probe_factory=ScriptedProbe)
    watcher.refresh()
    assert watcher.next_wait_s() == NO_SOURCE_WAIT_S
    from service.api.app import create_app

    kafka.produce("clicks", [(0, {"user_id": 1})])
    with api_client(create_app(settings, db)) as client:
        r = client.post("/v1/sources", json=spec(kafka))
        assert r.status_code == 201, r.text
    ScriptedProbe.marks = {p: (0, 1) for p in range(MOCK_PARTITIONS)}
    watcher.refresh()
    assert watcher.next_wait_s() == 0.1
    assert SourceWatcher(db, 2.0).next_wait_s() == 2.0  # never more often than asked
