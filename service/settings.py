"""One settings object per process, read from ``BACKFILL_*`` environment variables.

``DATABASE_URL`` (or ``BACKFILL_DATABASE_URL``) unset means the embedded default: a
private Postgres from the ``pgserver`` wheel under ``BACKFILL_DATA_DIR``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.logs import FORMAT_PATTERN, LEVEL_PATTERN

ENV_PREFIX = "BACKFILL_"
TOKEN_FIELDS = ("admin_token", "reader_token", "worker_token")
MIN_TOKEN_CHARS = 16
DEFAULT_OPEN_PATHS = ("/healthz", "/readyz", "/metrics")


class SettingsError(Exception):
    """Start-up configuration is invalid; the message names each bad variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("BACKFILL_DATABASE_URL", "DATABASE_URL"),
        description="Postgres URL; unset starts the embedded Postgres under data_dir",
    )
    # workers' own role (service/worker_role.py): no tokens, no catalog control
    worker_database_url: str | None = Field(
        default=None,
        description="Postgres URL handed to workers when they register; unset: DATABASE_URL",
    )
    data_dir: Path = Field(default=Path(".data"), description="embedded Postgres and local state")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: str = Field(default="info", pattern=LEVEL_PATTERN, description="every logger's")
    log_format: str = Field(
        default="text", pattern=FORMAT_PATTERN, description="text, or json: one object a line"
    )

    barrier_interval_ms: int = Field(default=1000, ge=10, le=600_000)
    checkpoint_frequency: int = Field(default=1, ge=1, le=10_000)
    default_vnode_count: int = Field(default=256, ge=1, le=32768)
    worker_lease_ms: int = Field(default=10_000, ge=100, le=3_600_000)
    max_pending_barriers: int = Field(default=100, ge=1, le=100_000)
    gc_retention_ms: int = Field(default=60_000, ge=0, le=86_400_000)
    # the failure policy (docs/operations.md#failed-jobs): a job whose actor fails for the
    # same cause again and again waits longer each time, then fails
    failure_backoff_initial_ms: int = Field(
        default=1_000, ge=0, le=3_600_000, description="a failing job's first recovery wait"
    )
    failure_backoff_max_ms: int = Field(
        default=60_000, ge=0, le=3_600_000, description="the doubling wait's bound"
    )
    failure_max_attempts: int = Field(
        default=5, ge=1, le=1_000, description="failures of one cause that fail the job"
    )
    failure_window_ms: int = Field(
        default=600_000, ge=1, le=86_400_000, description="how far back failures count"
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="larger request bodies are refused with a 413 before they are parsed",
    )
    max_bulk_body_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024 * 1024,
        description="larger NDJSON or CSV DML bodies (read as they come) are refused with a 413",
    )
    max_event_streams_per_token: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="following event streams one token (or address) may hold open; past it, 429",
    )
    idempotency_ttl_s: int = Field(
        default=86_400,
        ge=1,
        le=30 * 86_400,
        description="how long an Idempotency-Key is remembered (then cleaned up lazily)",
    )
    # authentication (README, "Security"): bearer tokens, stored only as sha256 hashes
    auth: bool = Field(default=True, description="false: every route is open (no tokens)")
    admin_token: SecretStr | None = None
    reader_token: SecretStr | None = None
    worker_token: SecretStr | None = None
    open_paths: Annotated[tuple[str, ...], NoDecode] = Field(
        default=DEFAULT_OPEN_PATHS, description="paths served without a token"
    )

    auto_migrate: bool = True
    run_barrier_loop: bool = True
    spawn_embedded_worker: bool = True

    @field_validator("database_url", "worker_database_url")
    @classmethod
    def _check_url(cls, v: str | None) -> str | None:
        if v is None or v.strip() == "":
            return None
        if not v.startswith(("postgresql://", "postgresql+psycopg2://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return v

    @field_validator(*TOKEN_FIELDS, mode="before")
    @classmethod
    def _empty_token_is_none(cls, v: Any) -> Any:
        return None if isinstance(v, str) and v.strip() == "" else v

    @field_validator(*TOKEN_FIELDS)
    @classmethod
    def _long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ValueError(f"a token must have at least {MIN_TOKEN_CHARS} characters")
        return v

    @model_validator(mode="after")
    def _tokens_differ(self) -> Settings:
        given = [t.get_secret_value() for f in TOKEN_FIELDS if (t := getattr(self, f)) is not None]
        if len(set(given)) != len(given):
            raise ValueError(
                "BACKFILL_ADMIN_TOKEN, BACKFILL_READER_TOKEN and BACKFILL_WORKER_TOKEN must differ"
            )
        return self

    @field_validator("open_paths", mode="before")
    @classmethod
    def _comma_separated(cls, v: Any) -> Any:
        """``BACKFILL_OPEN_PATHS=/healthz,/readyz``; empty: no path is open."""
        if isinstance(v, str):
            return tuple(p.strip() for p in v.split(",") if p.strip())
        return v

    @field_validator("open_paths")
    @classmethod
    def _absolute_paths(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for path in v:
            if not path.startswith("/"):
                raise ValueError(f"{path!r} is not a path (it must start with /)")
        return v

    @property
    def embedded(self) -> bool:
        return self.database_url is None


def _env_name(field: str) -> str:
    if field == "database_url":
        return "DATABASE_URL (or BACKFILL_DATABASE_URL)"
    return f"{ENV_PREFIX}{field.upper()}"


def load_settings(**overrides: Any) -> Settings:
    """Read and validate settings; a bad value raises ``SettingsError`` naming the variable."""
    try:
        return Settings(**overrides)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            if not err["loc"]:  # a rule over several settings: its input is all of them
                problems.append(err["msg"].removeprefix("Value error, "))
                continue
            field = str(err["loc"][0])
            got = "<hidden>" if field in TOKEN_FIELDS else repr(err.get("input"))
            problems.append(f"{_env_name(field)}: {err['msg']} (got {got})")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(problems)) from None
