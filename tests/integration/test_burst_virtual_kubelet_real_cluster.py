"""Issue 29's "done when", on a real virtual-kubelet node: the virtual-kubelet library's node,
lease and pod controllers with an in-memory provider as upstream's mock provider behaves
(``tests/virtual_kubelet.py``), registered on the real control plane beside two KWOK GPU nodes.

A training workload takes every in-cluster GPU and pushes the inference Deployment (behind a
PodDisruptionBudget) onto the virtual node; when the training ends the burst closes within the hold
and the inference pods come back at no more than the configured pace, the budget never broken,
none left pending (the story: ``test_burst_real_cluster.overflow_and_return``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient

from tests.integration.test_burst_real_cluster import Burst, burst_world, overflow_and_return
from tests.kube_cluster import ControlPlane
from tests.virtual_kubelet import LABELS, TAINT, VirtualKubelet


@pytest.fixture(scope="module")
def vk_node_name() -> str:
    return "burst-virtual-kubelet"


@pytest.fixture
def burst_on_vk(
    kube: ControlPlane,
    kube_admin: ApiClient,
    kube_healer_api: ApiClient,
    migrated_sqlite_url: str,
    vk_node: VirtualKubelet,
) -> Iterator[Burst]:
    with burst_world(kube, kube_admin, kube_healer_api, migrated_sqlite_url, burst_node=vk_node.name) as b:
        yield b


def test_training_pushes_inference_onto_the_virtual_kubelet_node_and_it_comes_back_at_the_pace(
    burst_on_vk: Burst, kube: ControlPlane, vk_node: VirtualKubelet
) -> None:
    node = burst_on_vk.core.read_node(vk_node.name)
    assert LABELS.items() <= (node.metadata.labels or {}).items()  # registered as virtual-kubelet does
    assert (TAINT["key"], TAINT["value"], TAINT["effect"]) in [
        (t.key, t.value, t.effect) for t in node.spec.taints
    ]
    seconds = overflow_and_return(burst_on_vk, kube, replicas=4)
    print(f"\nvirtual-kubelet: 4 inference pods back in the cluster {seconds:.1f} s after the training ended")
