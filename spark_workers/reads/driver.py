"""Reads on the driver: small or throttled epochs, one round trip per actor and round.

The reads themselves are the runners' (``ActorRunner.read_some``: with pushdown one
statement inside Postgres, otherwise the rows come here, the view is applied and they go
back), ``CHUNK_ROWS`` at a time, so a barrier waits little for one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_workers.reads.interface import ReadContext, ReadsOfOneRound

if TYPE_CHECKING:
    from spark_workers.reads.interface import Runner


class DriverReads(ReadsOfOneRound):
    """Table actors' reads on the driver."""

    def __init__(self, ctx: ReadContext) -> None:
        self.ctx = ctx
        self.pushdowns = 0  # reads that ran inside Postgres

    def read(self, runners: Sequence[Runner], budget: int) -> bool:
        did = False
        for runner in runners:
            with self.ctx.unless_dropped([runner]):
                if runner.read_some(self.ctx.conn, budget) >= 0:
                    did = True
                    if runner.pushed_where is not None:
                        self.pushdowns += 1
        return did
