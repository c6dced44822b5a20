from pathlib import Path

import pytest

from service.settings import SettingsError, load_settings
from spark_workers.settings import WorkerSettingsError, load_worker_settings


def test_defaults_mean_embedded_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("BACKFILL_DATABASE_URL", raising=False)
    s = load_settings()
    assert s.embedded
    assert s.data_dir == Path(".data")
    assert s.barrier_interval_ms == 1000
    assert s.checkpoint_frequency == 1


def test_values_come_from_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKFILL_BARRIER_INTERVAL_MS", "200")
    monkeypatch.setenv("BACKFILL_DATA_DIR", "/tmp/somewhere")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/db")
    s = load_settings()
    assert s.barrier_interval_ms == 200
    assert s.data_dir == Path("/tmp/somewhere")
    assert s.database_url == "postgresql://u@h/db"
    assert not s.embedded


@pytest.mark.parametrize(
    ("var", "value", "named"),
    [
        ("BACKFILL_BARRIER_INTERVAL_MS", "5", "BACKFILL_BARRIER_INTERVAL_MS"),
        ("BACKFILL_BARRIER_INTERVAL_MS", "fast", "BACKFILL_BARRIER_INTERVAL_MS"),
        ("BACKFILL_CHECKPOINT_FREQUENCY", "0", "BACKFILL_CHECKPOINT_FREQUENCY"),
        ("BACKFILL_PORT", "70000", "BACKFILL_PORT"),
        ("BACKFILL_LOG_LEVEL", "loud", "BACKFILL_LOG_LEVEL"),
        ("DATABASE_URL", "mysql://x/y", "DATABASE_URL"),
    ],
)
def test_bad_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, named: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert named in str(e.value)
    assert repr(value) in str(e.value)


def test_every_bad_variable_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKFILL_PORT", "-1")
    monkeypatch.setenv("BACKFILL_CHECKPOINT_FREQUENCY", "0")
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert "BACKFILL_PORT" in str(e.value)
    assert "BACKFILL_CHECKPOINT_FREQUENCY" in str(e.value)


def test_empty_database_url_means_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "")
    assert load_settings().embedded


def test_auth_is_on_by_default_and_tokens_stay_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("BACKFILL_AUTH", "BACKFILL_OPEN_PATHS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("BACKFILL_ADMIN_TOKEN", "a-long-enough-admin-token")
    monkeypatch.setenv("BACKFILL_READER_TOKEN", "")  # empty: not given
    s = load_settings()
    assert s.auth and s.open_paths == ("/healthz", "/readyz", "/metrics")
    assert s.admin_token is not None and s.reader_token is None
    assert "a-long-enough-admin-token" not in repr(s)


def test_open_paths_are_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKFILL_OPEN_PATHS", "/healthz, /metrics")
    assert load_settings().open_paths == ("/healthz", "/metrics")
    monkeypatch.setenv("BACKFILL_OPEN_PATHS", "")
    assert load_settings().open_paths == ()
    monkeypatch.setenv("BACKFILL_OPEN_PATHS", "healthz")
    with pytest.raises(SettingsError, match="BACKFILL_OPEN_PATHS"):
        load_settings()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BACKFILL_WORKER_TOKEN": "short-secret"}, "BACKFILL_WORKER_TOKEN: "),
        (
            {
                "BACKFILL_ADMIN_TOKEN": "same-token-for-two",
                "BACKFILL_READER_TOKEN": "same-token-for-two",
            },
            "must differ",
        ),
    ],
)
def test_bad_tokens_are_refused_without_showing_them(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for var in ("BACKFILL_ADMIN_TOKEN", "BACKFILL_READER_TOKEN", "BACKFILL_WORKER_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert message in str(e.value)
    assert not any(v in str(e.value) for v in env.values())


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("BACKFILL_SPARK_MODE", "sometimes"),
        ("BACKFILL_SPARK_MIN_ROWS", "0"),
        ("BACKFILL_SPARK_EPOCH_ROWS", "many"),
        ("BACKFILL_PUSHDOWN", "perhaps"),
    ],
)
def test_a_bad_worker_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(WorkerSettingsError) as e:
        load_worker_settings()
    assert var in str(e.value)
    assert repr(value) in str(e.value)
    load_settings()  # the control plane's settings do not read the worker's variables


def test_a_worker_reads_its_settings_and_token_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BACKFILL_SPARK_MODE", "never")
    monkeypatch.setenv("BACKFILL_SPARK_EPOCH_ROWS", "1234")
    monkeypatch.setenv("BACKFILL_WORKER_TOKEN", "a-worker-token-0123456789")
    s = load_worker_settings()
    assert (s.spark_mode, s.spark_epoch_rows) == ("never", 1234)
    assert s.worker_token is not None
    assert s.worker_token.get_secret_value() == "a-worker-token-0123456789"
    assert "a-worker-token" not in repr(s)
    monkeypatch.setenv("BACKFILL_WORKER_TOKEN", " ")
    assert load_worker_settings().worker_token is None
