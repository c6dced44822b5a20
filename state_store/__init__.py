"""Epoch-versioned tables in Postgres (used by the control plane and the workers)."""
