from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from service import migrate
from service.catalog.models import Base

CATALOG = {
    "relations", "sources", "graphs", "jobs", "workers", "actors",
    "vnode_progress", "split_progress", "epoch_pins",
}  # fmt: skip


def test_upgrade_from_empty_and_downgrade_back_to_empty(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    assert inspect(engine).get_table_names() == []
    migrate.upgrade(engine)
    assert migrate.at_head(engine)
    assert set(inspect(engine).get_table_names()) >= CATALOG
    with engine.connect() as conn:
        main = conn.execute(text("SELECT kind, committed_epoch FROM graphs WHERE id = 1")).one()
    assert tuple(main) == ("main", 0)
    assert "store" in inspect(engine).get_schema_names()

    migrate.downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    assert "store" not in inspect(engine).get_schema_names()
    assert migrate.current_revision(engine) is None

    migrate.upgrade(engine)  # and up again
    assert migrate.at_head(engine)
    engine.dispose()


def test_models_match_the_migrations(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_is_idempotent(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine)
    migrate.upgrade(engine)
    assert migrate.at_head(engine)
    engine.dispose()
