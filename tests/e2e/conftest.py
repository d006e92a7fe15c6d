"""Fixtures of the `healer run` end-to-end tests (tests/e2e/harness.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import World
from tests.kube_cluster import ControlPlane
from tests.services import PostgresServer


@pytest.fixture
def world(tmp_path: Path, kube: ControlPlane, kube_healer_token: str) -> Iterator[World]:
    """This test's world on the session's control plane; its objects are deleted at the end."""
    made = World(tmp_path, kube, kube_healer_token)
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    """An empty database of its own on the session's PostgreSQL server (healer migrates it)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = postgres.create_database(name)
    yield url
    postgres.drop_database(name)
