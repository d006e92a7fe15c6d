"""`healer run` with a capacity rule (issue 29): the leader's burst job, beside the tick, closes a
fresh burst node once the in-cluster GPUs have been free for the hold, opens it when an inference
pod waits for a GPU, and shows both on its dashboard.

Real processes and services: `healer run` as the chart's ServiceAccount on the real control plane
(KWOK nodes; a KWOK node labelled and tainted as a virtual-kubelet node is the burst node), SQLite.
No Prometheus is needed: the rule set holds no health rule.
"""

from __future__ import annotations

import httpx

from tests.e2e.harness import GROUP_LABEL, World
from tests.services import wait_until

VK_TAINT = {"key": "virtual-kubelet.io/provider", "value": "mock", "effect": "NoSchedule"}


def test_the_burst_job_closes_and_opens_the_burst_node(world: World) -> None:
    world.add_nodes(1, pool="h100", gpus=2)
    (burst,) = world.add_nodes(1, pool="", role="vk", gpus=100)
    vk = f"vk-{world.prefix}"
    world.core.patch_node(burst, {"metadata": {"labels": {"type": vk}}, "spec": {"taints": [VK_TAINT]}})
    namespace = world.namespace("inference")
    world.rules(
        "capacity:\n"
        "  - name: overflow\n"
        f"    burst_nodes: {{type: {vk}}}\n"
        f"    cluster_nodes: {{{GROUP_LABEL}: {world.prefix}}}\n"
        f"    namespaces: [{namespace}]\n"
        "    open: {pending_gpu_pods: 1, for: 1s}\n"
        "    close: {free_gpus_at_least: 1, hold: 2s}\n",
        "burst.yaml",
    )
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    config = world.config(
        db=db, prometheus_url="http://127.0.0.1:9", scheduler={"burst_interval_seconds": 0.5}
    )
    healer = world.start(config)
    key = f"{world.domain}/burst"

    def taints() -> list[str]:
        healer.alive()
        return [t["key"] for t in world.node(burst)["spec"].get("taints") or []]

    wait_until(lambda: key in taints(), timeout=60, interval=0.5, what="the burst node closed")
    assert VK_TAINT["key"] in taints()

    # An inference pod that wants more GPUs than the cluster has free: the burst opens.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "infer-0"},
        "spec": {
            "tolerations": [{"key": VK_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {GROUP_LABEL: world.prefix},
            "containers": [
                {
                    "name": "m",
                    "image": "registry.example/x:1",
                    "resources": {"limits": {"nvidia.com/gpu": "4"}},
                }
            ],
        },
    }
    world.core.create_namespaced_pod(namespace, pod)
    wait_until(lambda: key not in taints(), timeout=60, interval=0.5, what="the burst node opened")
    wait_until(
        lambda: world.core.read_namespaced_pod("infer-0", namespace).spec.node_name == burst,
        timeout=60,
        interval=0.5,
        what="the pod on the burst node",
    )
    page = httpx.get(f"{healer.url}/burst", timeout=10).text
    assert f'data-node="{burst}"' in page and "closed → open" in page and "open → closed" in page
