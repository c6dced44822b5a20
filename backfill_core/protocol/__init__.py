"""The contract between the control plane and the workers, in one place: the worker
protocol's messages (``assignment``: the poll's answer; ``messages``: registration,
collects, failure reports; ``exports``, ``imports``: export and import work, and
``claimed``: what they share), its error codes (``errors``) and the plans of the
worker's Spark jobs (``plan``). Each type decodes its JSON once (``from_json``) and
encodes it once (``to_json``); both sides use these, the control plane behind the
pydantic models of its HTTP edge (``service.api.workers``).
"""

from backfill_core.protocol.assignment import (
    Assignment,
    BarrierMessage,
    CdcRef,
    JobSpec,
    PollAnswer,
    RestoreState,
    SourceRef,
    SplitRestore,
    VnodeRestore,
)
from backfill_core.protocol.claimed import ClaimedTask, TaskReport, TaskState
from backfill_core.protocol.decode import MalformedMessage
from backfill_core.protocol.errors import SUPERSEDED, ErrorBody, ErrorCode
from backfill_core.protocol.exports import (
    ExportReport,
    ExportReportAnswer,
    ExportState,
    ExportTask,
)
from backfill_core.protocol.imports import (
    ImportReport,
    ImportReportAnswer,
    ImportState,
    ImportTask,
)
from backfill_core.protocol.messages import (
    CollectAnswer,
    CollectBatch,
    CollectBatchAnswer,
    CollectProgress,
    CollectRequest,
    CollectStatus,
    FailureReport,
    RegisterRequest,
    Registration,
)
from backfill_core.protocol.plan import (
    GroupStart,
    KafkaPlan,
    KafkaRange,
    MvWrite,
    ReadGroup,
    TablePlan,
    VnodeRead,
)

__all__ = [
    "SUPERSEDED",
    "Assignment",
    "BarrierMessage",
    "ClaimedTask",
    "CollectAnswer",
    "CollectBatch",
    "CollectBatchAnswer",
    "CollectProgress",
    "CollectRequest",
    "CollectStatus",
    "ErrorBody",
    "ErrorCode",
    "ExportReport",
    "ExportReportAnswer",
    "ExportState",
    "ExportTask",
    "FailureReport",
    "ImportReport",
    "ImportReportAnswer",
    "ImportState",
    "ImportTask",
    "GroupStart",
    "JobSpec",
    "MalformedMessage",
    "KafkaPlan",
    "KafkaRange",
    "MvWrite",
    "PollAnswer",
    "ReadGroup",
    "RegisterRequest",
    "Registration",
    "RestoreState",
    "CdcRef",
    "SourceRef",
    "SplitRestore",
    "TablePlan",
    "TaskReport",
    "TaskState",
    "VnodeRead",
    "VnodeRestore",
]
