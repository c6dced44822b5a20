"""Work a worker claims from the control plane and runs as one Spark job group, on a
thread of its own beside the actors' work: exports and imports (``spark_workers.exports``,
``spark_workers.imports``).

While the job runs the worker reports it running every ``report_s``; an answer other
than ``running`` (cancelled, or given up as lost) cancels the job's group, again until
the job ends: a job submitted after a cancel (the session or its Python workers were
still starting) is not cancelled by it. The end is reported a few times over, and a
worker that cannot is failed by the leader once its lease lapses.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from backfill_core.protocol import ClaimedTask, TaskReport, TaskState
from spark_workers.client import ControlPlaneClient
from spark_workers.spark_path import SparkPath

log = logging.getLogger(__name__)


class Answer(Protocol):
    @property
    def state(self) -> TaskState: ...


TaskT = TypeVar("TaskT", bound=ClaimedTask)
ReportT = TypeVar("ReportT", bound=TaskReport)


class ClaimedJobs(ABC, Generic[TaskT, ReportT]):
    """Claims one kind of work and runs it, one at a time, until ``stop`` is set."""

    kind: str  # "export", "import": in logs, thread names and Spark's job groups
    report_type: type[ReportT]  # its reports' type, built here for running and cancelled

    def __init__(
        self,
        client: ControlPlaneClient,
        spark: Callable[[], SparkPath | None],
        stop: threading.Event,
        *,
        claim_s: float = 1.0,
        report_s: float = 1.0,
    ) -> None:
        self.client = client
        self.spark = spark
        self.stop = stop
        self.claim_s = claim_s
        self.report_s = report_s
        self.ended = 0  # runs to an end, however it ended

    @abstractmethod
    def claim(self) -> TaskT | None: ...

    @abstractmethod
    def report(self, task: TaskT, report: ReportT) -> Answer:
        """Send a report on the task; the control plane's answer."""

    @abstractmethod
    def execute(self, spark: SparkPath, task: TaskT, group: str) -> ReportT:
        """Run the task's Spark job(s) in job group ``group``: its final report."""

    @abstractmethod
    def failed(self, task: TaskT, error: Exception) -> ReportT: ...

    def report_running(self, task: TaskT) -> bool:
        """Report the task running; whether the control plane still wants it."""
        answer = self.report(task, self.report_type(TaskState.RUNNING))
        return answer.state is TaskState.RUNNING

    def cancelled(self) -> ReportT:
        return self.report_type(TaskState.CANCELLED)

    def report_end(self, task: TaskT, final: ReportT) -> None:
        # not reported: the leader fails it once this worker is gone
        self.report(task, final)

    def run(self) -> None:
        while not self.stop.wait(self.claim_s):
            spark = self.spark()
            if spark is None or self.client.worker_id is None:
                continue  # not registered yet, or Spark is off on this worker
            try:
                task = self.claim()
            except Exception as e:  # the main loop handles the control plane's absence
                log.debug("could not claim an %s: %s", self.kind, e)
                continue
            if task is not None:
                self.run_one(spark, task)

    def run_one(self, spark: SparkPath, task: TaskT) -> None:
        group = f"{self.kind}-{task.id}"
        done = threading.Event()
        stopped = threading.Event()  # the control plane answered other than running

        def watch() -> None:
            while not done.wait(self.report_s):
                if stopped.is_set():
                    spark.session().sparkContext.cancelJobGroup(group)
                    continue
                try:
                    wanted = self.report_running(task)
                except Exception as e:
                    log.warning("could not report on %s %s: %s", self.kind, task.id, e)
                    continue
                if not wanted:
                    log.info("%s %s is over: stopping its job", self.kind, task.id)
                    stopped.set()
                    spark.session().sparkContext.cancelJobGroup(group)

        watcher = threading.Thread(target=watch, name=f"{group}-watch", daemon=True)
        watcher.start()
        final: ReportT
        try:
            final = self.execute(spark, task, group)
        except Exception as e:
            final = self.cancelled() if stopped.is_set() else self.failed(task, e)
        finally:
            done.set()
            watcher.join()
        self._report_end(task, final)
        self.ended += 1

    def _report_end(self, task: TaskT, final: ReportT) -> None:
        for attempt in range(5):  # the client retries transport errors itself
            try:
                self.report_end(task, final)
                return
            except Exception as e:
                log.warning(
                    "could not report the end of %s %s (%s): %s", self.kind, task.id, attempt, e
                )
                if self.stop.wait(1.0):
                    return


def spark_error_message(e: Exception) -> str:
    """The first line of Spark's error (a Py4J error carries the whole JVM stack)."""
    text: Any = getattr(e, "desc", None) or str(e) or type(e).__name__
    first = str(text).strip().splitlines()
    return (first[0] if first else type(e).__name__)[:2000]
