"""The catalog, the storage layer: models of the rows in Postgres, events, idempotency
keys, tokens and plain queries. Below the meta and the use cases: it imports neither."""
