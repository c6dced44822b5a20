"""Backfill executors: pure state machines, one per file, driven at epoch granularity."""
