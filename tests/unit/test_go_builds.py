"""Which tool builds a test waits for (tests/go_builds.py): on a cold machine the tests run while
the control plane still builds, and one that reaches it without waiting fails for good."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.go_builds import HELM_STATUS, KUBE_STATUS, VK_STATUS, needs


def item(*fixtures: str, **params: Any) -> pytest.Item:
    """What ``needs`` reads of a collected test: its fixtures, its parameters, its module."""
    fake = SimpleNamespace(fixturenames=list(fixtures), callspec=SimpleNamespace(params=params), module=None)
    return cast(pytest.Item, fake)


def test_a_test_using_the_control_plane_waits_for_it_and_helm() -> None:
    assert needs(item("kube")) == (KUBE_STATUS, HELM_STATUS)
    assert needs(item("vk_node", "kube")) == (KUBE_STATUS, HELM_STATUS, VK_STATUS)


def test_a_cluster_fixture_parametrized_with_kube_waits_for_the_control_plane() -> None:
    """test_k8s_contract.py's ``cluster`` asks for ``kube`` by name when its parameter is "kube"."""
    assert needs(item("cluster", cluster="kube")) == (KUBE_STATUS, HELM_STATUS)
    assert needs(item("cluster", cluster="emulator")) == ()
    assert needs(item("tmp_path", size=3)) == ()
