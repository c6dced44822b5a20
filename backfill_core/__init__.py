"""Pure shared core of the backfill service.

Imported by both the control plane (``service``) and the workers (``spark_workers``).
It must not import any I/O library (web framework, database driver, Spark, HTTP or
Kafka client); a test enforces this.
"""
