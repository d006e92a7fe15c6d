"""Fixtures around :mod:`healer_dev.k8s_emulator` (a real HTTP server on loopback).

Import the fixtures into a test module (``from tests.k8s_emulator import emulator, k8s_api``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient

from healer.config import KubernetesSettings
from healer_dev.k8s_emulator import KubernetesEmulator


@pytest.fixture
def emulator() -> Iterator[KubernetesEmulator]:
    """A fresh, started emulator (default namespaces only)."""
    with KubernetesEmulator() as emu:
        yield emu


@pytest.fixture
def k8s_api(emulator: KubernetesEmulator) -> Iterator[ApiClient]:
    """An official-client ``ApiClient`` talking to :func:`emulator` over HTTP."""
    with emulator.api_client() as api:
        yield api


@pytest.fixture
def k8s_settings() -> KubernetesSettings:
    """healer's Kubernetes settings for tests (domain ``healer.dev``, short timeouts)."""
    return KubernetesSettings(
        domain="healer.dev",
        namespace="healer-system",
        lease_duration_seconds=15,
        renew_interval_seconds=5,
        request_timeout_seconds=5,
    )
