"""Alembic migrations of the catalog (applied at start-up and by ``backfill db upgrade``)."""
