"""CDC tables' reads (``spark_workers.cdc_actor``): each round polls the upstream's
change stream briefly, reads the chunk the executor plans, and writes the result like
DML, in one store transaction (``CdcRunner.step``). On the driver: a slot is one stream,
read by one actor; chunk reads are bounded (``cdc_actor.CHUNK_ROWS``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_workers.reads.interface import ReadContext, ReadsOfOneRound

if TYPE_CHECKING:
    from spark_workers.cdc_actor import CdcRunner
    from spark_workers.reads.interface import Runner


class CdcReads(ReadsOfOneRound):
    def __init__(self, ctx: ReadContext) -> None:
        self.ctx = ctx

    def read(self, runners: Sequence[Runner], budget: int) -> bool:
        did = False
        for runner in runners:
            r: CdcRunner = runner  # type: ignore[assignment]
            with self.ctx.unless_dropped([runner]):
                r.step(self.ctx.conn)
                did = True
        return did
