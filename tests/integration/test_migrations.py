"""The Alembic migrations and the SQLAlchemy models agree, on SQLite and on PostgreSQL.

Other tests copy a template migrated once per session; here every database is migrated for real.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, Engine, insert, inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from healer.store import migrate
from healer.store.models import Base, Incident, Node


@pytest.fixture
def migrated_db_url(db_url: str) -> str:
    """``db_url`` with the schema created by running the Alembic migrations (no template)."""
    migrate.upgrade(db_url)
    return db_url


def test_upgrade_creates_every_table(engine: Engine) -> None:
    tables = set(inspect(engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    assert "alembic_version" in tables


def test_models_and_migrations_agree(engine: Engine) -> None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_one_open_incident_per_node(session_factory: sessionmaker[Session]) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with session_factory() as s, s.begin():
        node = Node(name="gpu-node-07", state="healthy", state_since=now, created_at=now, updated_at=now)
        s.add(node)
        s.flush()
        s.add(Incident(node_id=node.id, opened_at=now, closed_at=now))
        s.add(Incident(node_id=node.id, opened_at=now))
    with pytest.raises(IntegrityError), session_factory() as s, s.begin():
        s.add(Incident(node_id=node.id, opened_at=now))


def test_timestamps_come_back_aware_utc(session_factory: sessionmaker[Session]) -> None:
    when = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    with session_factory() as s, s.begin():
        s.add(Node(name="n1", state="healthy", state_since=when, created_at=when, updated_at=when))
    with session_factory() as s:
        node = s.query(Node).one()
        assert node.state_since == when
        assert node.state_since.tzinfo is not None


def test_cli_db_upgrade_creates_the_schema(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from healer.cli import app
    from healer.store.session import make_engine

    monkeypatch.setenv("HEALER_DATABASE__URL", db_url)
    result = CliRunner().invoke(app, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert "database at revision head" in result.output
    engine = make_engine(db_url)
    try:
        assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _columns(url: str, table: str) -> set[str]:
    """The columns of ``table`` in the database at ``url`` as it is now."""
    from healer.store.session import make_engine

    engine = make_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def _add_node(conn: Connection, state: str, now: datetime) -> None:
    """Node ``n1`` (id 1) in ``state`` since ``now``."""
    conn.execute(insert(Node).values(name="n1", state=state, state_since=now, created_at=now, updated_at=now))


def test_fencing_columns_come_and_go_with_their_migration(migrated_db_url: str) -> None:
    from alembic import command
    from sqlalchemy import select

    from healer.store import migrate
    from healer.store.models import Transition
    from healer.store.session import make_engine

    def columns(table: str) -> set[str]:
        return _columns(migrated_db_url, table)

    assert {"holder", "fencing_token"} <= columns("transitions") and "intent" in columns("nodes")
    command.downgrade(migrate.alembic_config(migrated_db_url), "0001")
    assert not {"holder", "fencing_token"} & columns("transitions") and "intent" not in columns("nodes")
    migrate.upgrade(migrated_db_url)
    now = datetime(2026, 3, 1, tzinfo=UTC)
    engine = make_engine(migrated_db_url)
    try:
        with engine.begin() as conn:
            _add_node(conn, "healthy", now)
            conn.execute(
                insert(Transition).values(
                    node_id=1,
                    from_state="healthy",
                    to_state="suspect",
                    actor="healer",
                    reason="r",
                    at=now,
                    holder="healer-b",
                    fencing_token=2**40,
                )
            )
            assert conn.execute(select(Transition.holder, Transition.fencing_token)).one() == (
                "healer-b",
                2**40,
            )
    finally:
        engine.dispose()


def test_the_incident_capture_column_comes_and_goes_with_its_migration(migrated_db_url: str) -> None:
    from alembic import command
    from sqlalchemy import select

    from healer.store.session import make_engine

    assert "capture" in _columns(migrated_db_url, "incidents")
    command.downgrade(migrate.alembic_config(migrated_db_url), "0008_outcomes")
    before = _columns(migrated_db_url, "incidents")
    assert "capture" not in before and "gpus" in before
    migrate.upgrade(migrated_db_url)
    now = datetime(2026, 12, 4, tzinfo=UTC)
    asked = {"nonce": "1-capture-1", "requested_at": now.isoformat(), "status": "requested"}
    engine = make_engine(migrated_db_url)
    try:
        with engine.begin() as conn:
            _add_node(conn, "quarantined", now)
            conn.execute(insert(Incident).values(node_id=1, opened_at=now, capture=asked))
            assert conn.execute(select(Incident.capture)).scalar_one() == asked
    finally:
        engine.dispose()
