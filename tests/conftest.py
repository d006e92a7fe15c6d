"""Shared fixtures: real PostgreSQL (one server per session) and databases on both backends."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from tests.services import PostgresServer, postgres_server

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
"""Exporter scrapes the tests serve (see each file's header for how it differs from a real scrape)."""


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the whole session."""
    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database URL, once on SQLite (a file) and once on PostgreSQL (a fresh database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'healer.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name)
    yield url
    server.drop_database(name)


@pytest.fixture
def migrated_db_url(db_url: str) -> str:
    """``db_url`` with the schema created by the Alembic migrations."""
    migrate.upgrade(db_url)
    return db_url


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    eng = make_engine(migrated_db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def session_factory(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)
