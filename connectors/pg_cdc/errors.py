"""The CDC connector's errors: each one a class with a stable ``code`` (callers tell
them apart by type or code, never by text; messages are for people)."""

from __future__ import annotations

__all__ = [
    "InsufficientPrivilege",
    "LogicalReplicationOff",
    "NoPrimaryKey",
    "PgCdcError",
    "PublicationMismatch",
    "ReplicaIdentityNotFull",
    "SlotMismatch",
    "TableNotFound",
    "TruncateUnsupported",
    "UnsupportedColumn",
    "UnsupportedValue",
    "UpstreamSchemaChanged",
    "UpstreamTooOld",
    "UpstreamUnreachable",
]


class PgCdcError(Exception):
    """Base of the connector's errors; ``code`` names the kind."""

    code = "cdc_error"


class UpstreamUnreachable(PgCdcError):
    """The upstream server cannot be connected to (or the connection broke)."""

    code = "cdc_upstream_unreachable"


class UpstreamTooOld(PgCdcError):
    """A server before Postgres 13 (no ``pg_current_snapshot()``, which chunk reads use)."""

    code = "cdc_upstream_too_old"


class LogicalReplicationOff(PgCdcError):
    """The server is not set up for logical replication (``wal_level``, slots, senders)."""

    code = "cdc_logical_replication_off"


class InsufficientPrivilege(PgCdcError):
    """The upstream role lacks REPLICATION, SELECT on the table, or its ownership."""

    code = "cdc_insufficient_privilege"


class TableNotFound(PgCdcError):
    code = "cdc_table_not_found"


class NoPrimaryKey(PgCdcError):
    code = "cdc_no_primary_key"


class UnsupportedColumn(PgCdcError):
    """A column whose type (or name) has no counterpart in our schemas."""

    code = "cdc_unsupported_column"

    def __init__(self, text: str, column: str, type_name: str) -> None:
        super().__init__(text)
        self.column = column
        self.type_name = type_name


class UnsupportedValue(PgCdcError):
    """A value our column type cannot hold (NaN, infinity, a year beyond 9999...)."""

    code = "cdc_unsupported_value"


class ReplicaIdentityNotFull(PgCdcError):
    code = "cdc_replica_identity_not_full"


class PublicationMismatch(PgCdcError):
    """A named publication does not publish the table (or not all of its changes)."""

    code = "cdc_publication_mismatch"


class SlotMismatch(PgCdcError):
    """A slot of that name exists with another plugin, kind or database."""

    code = "cdc_slot_mismatch"


class UpstreamSchemaChanged(PgCdcError):
    """The stream described the table with other columns, types or key than ours."""

    code = "cdc_upstream_schema_changed"


class TruncateUnsupported(PgCdcError):
    """A TRUNCATE of the table, turned into events without a source of its keys."""

    code = "cdc_truncate_unsupported"
