"""Shared fixtures: real PostgreSQL (one server per session) and databases on both backends."""

from __future__ import annotations

import contextlib
import shutil
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


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
"""The database backends every database fixture runs on."""

POSTGRES_TEMPLATE = "healer_template"
"""The database on the session's PostgreSQL server that holds the migrated schema."""


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per session (per xdist worker); tests get copies of it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "healer.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_template(postgres: PostgresServer) -> str:
    """The name of a PostgreSQL database migrated once per session; tests get copies of it."""
    migrate.upgrade(postgres.create_database(POSTGRES_TEMPLATE))
    return POSTGRES_TEMPLATE


@pytest.fixture
def migrated_sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A SQLite database with the schema in place: a copy of the session's migrated template."""
    path = tmp_path / "healer.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@contextlib.contextmanager
def _postgres_database(server: PostgresServer, *, template: str | None = None) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name, template=template)
    try:
        yield url
    finally:
        server.drop_database(name)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database URL, once on SQLite (a file) and once on PostgreSQL (a fresh database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'healer.db'}"
        return
    with _postgres_database(request.getfixturevalue("postgres")) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def migrated_db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database with the schema in place, on both backends: a copy of a template migrated once
    per session (``tests/integration/test_migrations.py`` runs the real migrations per backend)."""
    if request.param == "sqlite":
        yield request.getfixturevalue("migrated_sqlite_url")
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    with _postgres_database(server, template=request.getfixturevalue("postgres_template")) as url:
        yield url


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    eng = make_engine(migrated_db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def session_factory(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)
