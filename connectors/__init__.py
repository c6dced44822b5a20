"""Clients of the external systems sources read from (Kafka)."""
