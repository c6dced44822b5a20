"""PySpark workers: run backfill actors as state machines and report over HTTP."""
