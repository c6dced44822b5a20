"""Worker process entry point (``backfill worker``)."""

from spark_workers.runtime import run_worker

__all__ = ["run_worker"]
