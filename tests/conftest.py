"""Shared fixtures: real PostgreSQL (one server per session) and databases on both backends; a real
Kubernetes control plane (one per session, when built)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from tests.kube_cluster import BUILD_HINT, ControlPlane, control_plane, find_binaries
from tests.kube_cluster import REPORT as KUBE_REPORT
from tests.services import PostgresServer, postgres_server

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


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


# --- a real Kubernetes control plane (tests/kube_cluster.py) --------------------------------------


@pytest.fixture(scope="session")
def kube() -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK for the session.

    Skips (one line saying how to build them) when the binaries are not built, and fails instead
    when ``HEALER_REQUIRE_KUBE=1`` (CI).
    """
    bindir = find_binaries()
    if bindir is None:
        message = f"no Kubernetes control plane built: run `{BUILD_HINT}` (needs Go) to run these tests"
        if os.environ.get("HEALER_REQUIRE_KUBE") == "1":
            pytest.fail(message + " (HEALER_REQUIRE_KUBE=1)")
        pytest.skip(message)
    with control_plane(bindir) as cp:
        yield cp


@pytest.fixture(scope="session")
def kube_healer_token(kube: ControlPlane) -> str:
    """A token of ServiceAccount ``healer-system/healer``, bound by deploy/base/rbac.yaml (not admin)."""
    documents = [
        d
        for f in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml")
        for d in yaml.safe_load_all((REPO / "deploy" / "base" / f).read_text())
        if d
    ]
    kube.apply(documents)
    return kube.service_account_token("healer-system", "healer")


@pytest.fixture
def kube_healer_api(kube: ControlPlane, kube_healer_token: str) -> Iterator[ApiClient]:
    """An ``ApiClient`` that is healer: its ServiceAccount, its ClusterRole, nothing more."""
    with kube.client(kube_healer_token) as api:
        yield api


@pytest.fixture
def kube_admin(kube: ControlPlane) -> Iterator[ApiClient]:
    """A cluster-admin ``ApiClient`` for test set-up and assertions."""
    with kube.admin_client() as api:
        yield api


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in KUBE_REPORT:
        terminalreporter.write_line(line)
