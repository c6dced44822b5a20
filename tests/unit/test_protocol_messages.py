"""Every message of the worker protocol and every Spark plan survives its JSON: what
``to_json`` writes, ``from_json`` reads back equal (through real JSON text too)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from backfill_core.executors.messages import BarrierKind
from backfill_core.protocol import (
    Assignment,
    BarrierMessage,
    CdcRef,
    CollectAnswer,
    CollectBatch,
    CollectBatchAnswer,
    CollectProgress,
    CollectRequest,
    CollectStatus,
    FailureReport,
    GroupStart,
    JobSpec,
    KafkaPlan,
    KafkaRange,
    MvWrite,
    PollAnswer,
    ReadGroup,
    RegisterRequest,
    Registration,
    RestoreState,
    SourceRef,
    SplitRestore,
    TablePlan,
    VnodeRead,
    VnodeRestore,
)
from backfill_core.schema import Column, ColumnType, TableSchema

ints = st.integers(min_value=0, max_value=2**63 - 1)
small = st.integers(min_value=0, max_value=2**31 - 1)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
opt_ints = st.none() | ints
# JSON scalars a key or a report may hold (no floats: NaN is no JSON)
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | names
keys = st.none() | st.lists(scalars, min_size=1, max_size=3)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)

vnode_rows = st.builds(VnodeRestore, small, names, keys, ints, opt_ints)
split_rows = st.builds(SplitRestore, names, names, opt_ints, ints, opt_ints)
reports = st.dictionaries(names.filter(lambda k: k not in ("vnodes", "splits")), json_values)
progress = st.builds(
    CollectProgress.of,
    st.none() | st.lists(vnode_rows, max_size=4).map(tuple),
    st.none() | st.lists(split_rows, max_size=4).map(tuple),
    reports,
)
collects = st.builds(
    CollectRequest, small, small, ints, ints, st.none() | progress, ints, st.booleans()
)
# as the meta records them: actor ids, split changes keyed by actor id (text in JSON)
mutations = st.none() | st.fixed_dictionaries(
    {"add": st.lists(small, max_size=3)},
    optional={"splits": st.dictionaries(small.map(str), st.lists(names, max_size=2))},
)
epoch_pairs = st.tuples(st.integers(0, 2**62), st.integers(1, 2**62)).map(
    lambda p: (p[0], p[0] + p[1])
)
barriers = st.builds(
    lambda epochs, *rest: BarrierMessage(*epochs, *rest),
    epoch_pairs,
    st.sampled_from(BarrierKind),
    mutations,
    opt_ints,
    st.none() | st.dictionaries(names, st.tuples(ints, ints), max_size=3),
)
restores = st.builds(
    RestoreState,
    st.lists(vnode_rows, max_size=3).map(tuple),
    st.just(()),
    st.booleans(),
) | st.builds(
    RestoreState,
    st.just(()),
    st.lists(split_rows, min_size=1, max_size=3).map(tuple),
    st.booleans(),
)
SCHEMA_JSON = {"columns": [{"name": "id", "type": "bigint"}], "primary_key": ["id"]}
jobs = st.builds(
    JobSpec,
    small,
    names,
    st.sampled_from(["arrangement", "chain", "snapshot", "source", "cdc"]),
    names,
    st.none() | names,
    st.just(SCHEMA_JSON),
    st.none() | st.builds(SourceRef, small, st.just({"topic": "t"})),
    names,
    st.just(SCHEMA_JSON),
    st.lists(names, max_size=3),
    json_values,
    st.none() | small,
    st.booleans(),
    opt_ints,
    st.none() | st.builds(CdcRef, small, names, names, names, names),
)
assignments = st.builds(
    Assignment,
    small,
    small,
    small,
    small,
    st.lists(st.tuples(small, small).map(list), max_size=2),
    st.lists(names, max_size=2),
    jobs,
    st.lists(barriers, max_size=3),
    st.none() | restores,
)


def _through_text(data: dict[str, Any]) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(json.dumps(data))
    return decoded


def _round_trips(message: Any) -> None:
    cls = type(message)
    assert cls.from_json(message.to_json()) == message
    assert cls.from_json(_through_text(message.to_json())) == message


@given(st.builds(RegisterRequest, names, small), st.builds(Registration, small, small, names))
def test_registration_round_trips(request: RegisterRequest, answer: Registration) -> None:
    _round_trips(request)
    _round_trips(answer)


@given(collects, st.lists(collects, min_size=1, max_size=3))
def test_collects_round_trip(collect: CollectRequest, batch: list[CollectRequest]) -> None:
    _round_trips(collect)
    _round_trips(CollectBatch(batch))


@given(st.lists(st.builds(CollectAnswer, st.sampled_from(CollectStatus), ints), max_size=3))
def test_collect_answers_round_trip(answers: list[CollectAnswer]) -> None:
    for a in answers:
        _round_trips(a)
    _round_trips(CollectBatchAnswer(answers))


@given(st.builds(FailureReport, names, st.none() | small))
def test_failure_reports_round_trip(report: FailureReport) -> None:
    _round_trips(report)


@given(barriers)
def test_barriers_round_trip_and_decode_for_the_executors(barrier: BarrierMessage) -> None:
    _round_trips(barrier)
    decoded = barrier.barrier
    assert (decoded.epoch.prev, decoded.epoch.curr, decoded.kind) == (
        barrier.prev,
        barrier.curr,
        barrier.kind,
    )
    added = set((barrier.mutation or {}).get("add") or ())
    assert all(barrier.adds(a) for a in added)
    assert not barrier.adds(2**31 + 1)


@given(st.builds(PollAnswer, small, small, st.lists(assignments, max_size=3)))
def test_poll_answers_round_trip(answer: PollAnswer) -> None:
    _round_trips(answer)


def test_progress_keeps_the_executors_report_and_the_wire_of_each_kind() -> None:
    """An arrangement reports its vnodes, a snapshot backfill its figures besides, a
    source its splits and phase: the JSON is what the meta's SQL reads."""
    table = {"vnodes": [{"vnode": 1, "state": "in_progress", "current_pos": [3], "row_count": 2}]}
    source = {"splits": [{"split": "0", "state": "backfilling"}], "phase": "backfilling"}
    for wire in (table, source, {"vnodes": [], "phase": "snapshot", "finished_snapshot": True}):
        decoded = CollectProgress.from_json(wire)
        assert set(decoded.to_json()) == set(wire)
        assert {k: v for k, v in decoded.to_json().items() if k not in ("vnodes", "splits")} == {
            k: v for k, v in wire.items() if k not in ("vnodes", "splits")
        }
    [row] = CollectProgress.from_json(table).vnodes or ()
    assert row == VnodeRestore(1, "in_progress", [3], 2, None)


SCHEMA = TableSchema.build(
    [Column("id", ColumnType.BIGINT, False), Column("v", ColumnType.TEXT)], ["id"]
)
mv_writes = st.builds(
    MvWrite,
    names,
    names,
    st.just(SCHEMA),
    st.lists(names, max_size=3),
    json_values,
    small,
    small,
    ints,
)
vnode_reads = st.builds(VnodeRead, small, keys, small)
groups = st.builds(ReadGroup, small, st.lists(st.builds(GroupStart, small, keys), max_size=3))


@given(
    st.builds(
        TablePlan,
        mv_writes,
        names,
        st.just(SCHEMA),
        ints,
        st.lists(st.lists(vnode_reads, max_size=3), max_size=3),
        st.none() | st.lists(groups, max_size=3),
        st.none() | names,
        st.booleans(),
    ),
    st.builds(
        KafkaPlan,
        mv_writes,
        st.just({"bootstrap_servers": "b:9092", "topic": "t"}),
        st.just(SCHEMA),
        st.lists(
            st.lists(st.builds(KafkaRange, small, small, opt_ints, ints, small, opt_ints)),
            max_size=3,
        ),
    ),
)
def test_spark_plans_round_trip_through_their_text(table: TablePlan, kafka: KafkaPlan) -> None:
    assert TablePlan.from_text(table.to_text()) == table
    assert KafkaPlan.from_text(kafka.to_text()) == kafka


def test_a_plan_is_flat_json_with_its_reads_as_arrays() -> None:
    """The tasks' JSON, as the plans were hand-built before: one object, reads as arrays."""
    write = MvWrite("dsn", "mv", SCHEMA, ["id"], None, 1, 0, 9)
    plan = TablePlan(write, "up", SCHEMA, 8, [[VnodeRead(3, [5], 10)]])
    wire = json.loads(plan.to_text())
    assert wire["partitions"] == [[[3, [5], 10]]] and wire["graph_id"] == 1
    assert "groups" not in wire and "rounds" not in wire
    pushed = TablePlan(write, "up", SCHEMA, 8, groups=[ReadGroup(100, [GroupStart(0, None)])])
    assert json.loads(pushed.to_text())["groups"] == [[100, [[0, None]]]]
    assert plan.pk_from_json([7]) == (7,) and plan.pk_from_json(None) is None
