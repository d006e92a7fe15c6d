"""Fixtures of the `healer run` end-to-end tests (tests/e2e/harness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import World
from tests.kube_cluster import ControlPlane


@pytest.fixture
def world(tmp_path: Path, kube: ControlPlane, kube_healer_token: str) -> Iterator[World]:
    """This test's world on the session's control plane; its objects are deleted at the end."""
    made = World(tmp_path, kube, kube_healer_token)
    try:
        yield made
    finally:
        made.cleanup()
