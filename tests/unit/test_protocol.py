"""The worker protocol's shared definitions: one decoding of each message and error."""

from __future__ import annotations

from backfill_core.executors.messages import BarrierKind
from backfill_core.protocol import (
    Assignment,
    BarrierMessage,
    CdcRef,
    ErrorBody,
    ErrorCode,
    JobSpec,
    RestoreState,
    SourceRef,
    SplitRestore,
    VnodeRestore,
)

SCHEMA = {"columns": [{"name": "id", "type": "bigint"}], "primary_key": ["id"]}


def _job(**changes: object) -> JobSpec:
    spec = JobSpec(
        id=3,
        name="mv",
        kind="arrangement",
        state="creating",
        upstream_table="t_1",
        upstream_schema=SCHEMA,
        source=None,
        mv_table="t_2",
        mv_schema=SCHEMA,
        columns=["id"],
        filter={"col": "id", "op": ">", "value": 1},
        rate_limit=None,
        paused=False,
        snapshot_epoch=None,
    )
    return spec if not changes else JobSpec(**(spec.__dict__ | changes))  # type: ignore[arg-type]


def test_an_assignment_round_trips_through_json() -> None:
    table = Assignment(
        actor_id=7,
        job_id=3,
        graph_id=2,
        recovery_seq=1,
        vnodes=[[0, 128]],
        splits=[],
        job=_job(),
        barriers=[BarrierMessage(1, 2, BarrierKind.INITIAL)],
        restore=RestoreState(vnodes=(VnodeRestore(5, "in_progress", [41], 40, 65536),)),
    )
    source = Assignment(
        actor_id=8,
        job_id=4,
        graph_id=2,
        recovery_seq=0,
        vnodes=[],
        splits=["0", "1"],
        job=_job(kind="source", upstream_table=None, source=SourceRef(9, {"topic": "t"})),
        barriers=[],
        restore=RestoreState(splits=(SplitRestore("0", "done", 99, 100, 99),), finished=True),
    )
    mirror = Assignment(
        **(
            table.__dict__
            | {
                "job": _job(
                    kind="cdc", cdc=CdcRef(5, "postgresql://u:pw@h/db", "public.t", "p", "s")
                )
            }
        )
    )
    assert "pw" not in repr(mirror.job.cdc)  # the DSN is a secret: never in a log line
    for a in (table, source, mirror, Assignment(**(table.__dict__ | {"restore": None}))):
        assert Assignment.from_json(a.to_json()) == a


def test_error_bodies_decode_to_their_code_or_none() -> None:
    body = ErrorBody(ErrorCode.STALE_COLLECT, "stale", {"actor_id": 4}).to_json()
    decoded = ErrorBody.from_json(body)
    assert decoded.protocol_code is ErrorCode.STALE_COLLECT and decoded.actor_id == 4
    assert (
        ErrorBody.from_json({"error": {"code": "conflict", "message": "m"}}).protocol_code is None
    )
    for odd in ("<html>bad gateway</html>", None, {"error": "x"}, {"detail": "y"}):
        assert ErrorBody.from_json(odd).protocol_code is None
    assert ErrorBody("x", "m", {"actor_id": True}).actor_id is None  # JSON true is no id
