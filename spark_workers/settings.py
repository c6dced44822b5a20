"""A worker's own settings, read from the same ``BACKFILL_*`` environment variables as the
control plane's (README, "Configuration") but only those a worker uses: the worker
package stands on the shared packages, not on the control plane's settings."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "BACKFILL_"


class WorkerSettingsError(Exception):
    """A worker's configuration is invalid; the message names each bad variable."""


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # sent as the bearer token; the control plane decides whether it is good
    worker_token: SecretStr | None = None

    # when an epoch's snapshot reads go through Spark
    spark_master: str = Field(default="local[*]", description="Spark master of each worker")
    spark_mode: str = Field(
        default="auto",
        pattern=r"^(auto|always|never)$",
        description="auto: Spark for large epochs (see spark_min_rows), the driver otherwise",
    )
    spark_min_rows: int = Field(default=100_000, ge=1, le=1_000_000_000)
    spark_warm_up: bool = Field(
        default=True,
        description="start the Spark application and its Python workers when the worker "
        "registers, not at the first large read (which would pay their start-up)",
    )
    spark_epoch_rows: int = Field(
        default=400_000, ge=1, le=1_000_000_000, description="rows one Spark job reads per job"
    )
    spark_rounds: bool = Field(
        default=True,
        description="the Spark job of an unthrottled table backfill whose view runs inside "
        "Postgres spans epochs: its groups of reads run as rounds at the epochs the worker "
        "releases, and a barrier waits for the rounds under way only (spark_workers.rounds)",
    )
    pushdown: bool = Field(
        default=True,
        description="run a view that has a SQL form inside Postgres (each Spark task, and "
        "the driver for small epochs, writes its snapshot reads with one INSERT ... SELECT) "
        "instead of moving the rows through Spark or the driver; views with jsonb filter "
        "leaves always move",
    )

    @field_validator("worker_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, v: Any) -> Any:
        return None if isinstance(v, str) and v.strip() == "" else v


def load_worker_settings(**overrides: Any) -> WorkerSettings:
    """Read and validate a worker's settings; a bad value raises ``WorkerSettingsError``
    naming the variable."""
    try:
        return WorkerSettings(**overrides)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            got = "<hidden>" if field == "worker_token" else repr(err.get("input"))
            problems.append(f"{ENV_PREFIX}{field.upper()}: {err['msg']} (got {got})")
        raise WorkerSettingsError("invalid configuration:\n  " + "\n  ".join(problems)) from None
