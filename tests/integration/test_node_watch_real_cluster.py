"""The watched store of Nodes on the real control plane (tests/kube_cluster.py), reached through
the loopback proxy (tests/kube_proxy.py) that counts the requests and can cut open watches.

A user sees: after one LIST, the controller's reads of the cluster's nodes (pools, healer's marks,
GPU nodes) make no request at all; a node added, relabelled or deleted shows within moments; a
watch whose connection drops is resumed without a LIST; a version the server no longer keeps
(410) lists again; a store that hears nothing past its staleness answers "unknown", and the
adapter lists instead of trusting it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from kubernetes import client as k8s

from healer.actions import watch_cache
from healer.actions.addresses import KubernetesAddresses
from healer.actions.kubernetes import KubernetesNodeActions
from healer.actions.node_watch import NodeWatch
from healer.config import KubernetesSettings
from healer.controller.observe import read_all
from healer.model.node import Ownership
from tests.kube_cluster import ControlPlane
from tests.kube_proxy import GONE, ApiProxy, api_proxy
from tests.services import wait_until

NODES = "/api/v1/nodes"


@pytest.fixture
def proxy(kube: ControlPlane) -> Iterator[ApiProxy]:
    with api_proxy(kube.url, kube.ca_file) as running:
        yield running


def via(proxy: ApiProxy, kube: ControlPlane) -> k8s.ApiClient:
    configuration = k8s.Configuration()
    configuration.host = proxy.url
    configuration.api_key = {"authorization": f"Bearer {kube.admin_token}"}
    return k8s.ApiClient(configuration)


def names(watch: NodeWatch) -> set[str]:
    return {n["metadata"]["name"] for n in watch.nodes() or []}


def test_a_list_is_read_page_by_page_and_the_watch_goes_on_from_its_snapshot(
    kube: ControlPlane, proxy: ApiProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of 2 (10,000 real Nodes are read 500 at a time, never all parsed at once): the store
    holds every node of every page, and the watch started from the list's snapshot shows a node
    added after it."""
    monkeypatch.setattr(watch_cache, "LIST_PAGE", 2)
    prefix = f"p-{uuid.uuid4().hex[:6]}"
    paged = [f"{prefix}-gpu-{i:02d}" for i in range(5)]
    kube.add_nodes(paged, gpus=8)
    watch = NodeWatch(via(proxy, kube), timeout=10)
    watch.start()
    try:
        wait_until(lambda: set(paged) <= names(watch), timeout=30, what="every page in the store")
        pages = proxy.list_pages(NODES)
        assert all("limit=2" in page for page in pages), pages
        assert len(pages) >= 3 and sum("continue=" in page for page in pages) == len(pages) - 1, pages
        assert proxy.lists(NODES) == 1 and watch.lists == 1
        # Nothing lost between pages, nothing twice. Other tests' nodes come and go meanwhile on
        # the shared control plane: the watch catches up with them, the pages' own are exact.
        assert {n for n in names(watch) if n.startswith(prefix)} == set(paged)
        assert len(watch.nodes() or []) == len(names(watch))
        admin = k8s.CoreV1Api(kube.admin_client())
        wait_until(
            lambda: names(watch) == {n.metadata.name for n in admin.list_node().items},
            timeout=30,
            what="the store equal to the cluster's nodes",
        )

        late = f"{prefix}-gpu-late"
        kube.add_nodes([late], gpus=8)
        wait_until(lambda: late in names(watch), timeout=30, what="a node added after the list")
        assert proxy.lists(NODES) == 1  # the watch went on from the list's snapshot: no LIST again
    finally:
        watch.stop()


def test_reads_come_from_the_watch_and_changes_show(kube: ControlPlane, proxy: ApiProxy) -> None:
    prefix = f"w-{uuid.uuid4().hex[:6]}"
    first, second = f"{prefix}-gpu-00", f"{prefix}-gpu-01"
    kube.add_nodes([first], gpus=8)
    api = via(proxy, kube)
    watch = NodeWatch(api, timeout=10)
    watch.start()
    try:
        wait_until(lambda: first in names(watch), timeout=30, what="the first list")
        assert proxy.lists(NODES) == 1
        adapter = KubernetesNodeActions(api, KubernetesSettings(domain="healer.dev"), node_watch=watch)
        addresses = KubernetesAddresses(
            api, KubernetesSettings(domain="healer.dev", exporter_pod_selector=""), node_watch=watch
        )
        for _ in range(5):  # what a tick reads: pools, healer's marks, GPU nodes, node addresses
            assert first in adapter.node_pools()
            adapter.owned_nodes()
            assert first in adapter.gpu_nodes()
            assert first in (addresses.address_book().node_names or ())
        assert proxy.lists(NODES) == 1  # none of those listed

        kube.add_nodes([second], gpus=0)
        wait_until(lambda: second in names(watch), timeout=30, what="a new node seen")
        assert second not in adapter.gpu_nodes() and first in adapter.gpu_nodes()
        admin = k8s.CoreV1Api(kube.admin_client())
        admin.patch_node(first, {"metadata": {"labels": {"pool": "h100"}}})
        wait_until(
            lambda: any(n["metadata"].get("labels", {}).get("pool") == "h100" for n in watch.nodes() or []),
            timeout=30,
            what="a label change seen",
        )
        admin.delete_node(second)
        wait_until(lambda: second not in names(watch), timeout=30, what="a deleted node gone")

        # The connection drops: the watch resumes from its version, without a LIST.
        watches = watch.watches
        assert proxy.cut() >= 1
        wait_until(lambda: watch.watches > watches, timeout=30, what="the watch resumed")
        admin.patch_node(first, {"metadata": {"labels": {"pool": "a100"}}})
        wait_until(
            lambda: any(n["metadata"].get("labels", {}).get("pool") == "a100" for n in watch.nodes() or []),
            timeout=30,
            what="a change after the resume",
        )
        assert proxy.lists(NODES) == 1
        # Trimmed: what healer reads, not the whole object.
        (kept,) = [n for n in watch.nodes() or [] if n["metadata"]["name"] == first]
        assert set(kept["status"]) <= {"capacity", "allocatable", "addresses", "conditions"}
        assert kept["status"]["capacity"] == {"nvidia.com/gpu": "8"}
    finally:
        watch.stop()
        k8s.CoreV1Api(kube.admin_client()).delete_node(first)


def test_an_expired_version_lists_again(kube: ControlPlane, proxy: ApiProxy) -> None:
    name = f"w-{uuid.uuid4().hex[:6]}-gpu-00"
    kube.add_nodes([name], gpus=8)
    watch = NodeWatch(via(proxy, kube), timeout=10)
    watch.start()
    try:
        wait_until(lambda: watch.nodes() is not None, timeout=30, what="the first list")
        # The version is compacted away (etcd compacts every 5 minutes): the next watch gets 410.
        proxy.fail(1.0, seed=0, path_regex=f"^{NODES}$", kinds=(GONE,))
        proxy.cut()
        wait_until(lambda: watch.relists >= 1, timeout=30, what="a list after 410")
        proxy.fail(0, seed=0)
        wait_until(lambda: watch.lists == 2, timeout=30, what="listed again")
        # ... and watching again: a change shows.
        mark = uuid.uuid4().hex[:8]
        k8s.CoreV1Api(kube.admin_client()).patch_node(name, {"metadata": {"labels": {"watch-test": mark}}})
        wait_until(
            lambda: any(
                n["metadata"].get("labels", {}).get("watch-test") == mark for n in watch.nodes() or []
            ),
            timeout=30,
            what="a change seen after the list",
        )
    finally:
        watch.stop()
        k8s.CoreV1Api(kube.admin_client()).delete_node(name)


def test_a_store_that_hears_nothing_is_not_trusted(kube: ControlPlane, proxy: ApiProxy) -> None:
    api = via(proxy, kube)
    watch = NodeWatch(api, timeout=10, stale_seconds=2, watch_seconds=60)
    watch.start()
    try:
        wait_until(lambda: watch.nodes() is not None, timeout=30, what="the first list")
        proxy.hold("GET", f"^{NODES}$", seconds=8, times=1)  # the next watch hangs
        watches = watch.watches
        proxy.cut()
        wait_until(lambda: watch.nodes() is None, timeout=30, what="the store gone stale")
        age = watch.age_seconds()  # the cut dropped it (None), or it was silent past 2 s
        assert age is None or age > 2
        adapter = KubernetesNodeActions(api, KubernetesSettings(domain="healer.dev"), node_watch=watch)
        before = proxy.lists(NODES)
        adapter.node_pools()  # the adapter lists instead of trusting the stale store
        assert proxy.lists(NODES) == before + 1
        # The held watch answers at last: the store is heard from again (then, on a quiet cluster
        # and a staleness of 2 s, it goes stale again until the next event).
        wait_until(lambda: watch.watches > watches, timeout=30, what="the watch back after the hold")
    finally:
        watch.stop()


def test_a_pass_starts_from_the_watch_but_never_from_before_its_own_cordon(
    kube: ControlPlane, proxy: ApiProxy
) -> None:
    """A burst of newly firing nodes is planned from the watched views, without a GET each; a node
    healer has just cordoned or released is read with a GET until the watch brings that write
    back, so the next step never sees the node as it was before (a cordon missing from the old
    view would read as a human's uncordon)."""
    prefix = f"w-{uuid.uuid4().hex[:6]}"
    nodes = [f"{prefix}-gpu-{i:02d}" for i in range(3)]
    kube.add_nodes(nodes, gpus=8)
    api = via(proxy, kube)
    watch = NodeWatch(api, timeout=10)
    watch.start()
    try:
        wait_until(lambda: set(nodes) <= names(watch), timeout=30, what="the first list")
        adapter = KubernetesNodeActions(api, KubernetesSettings(domain="healer.dev"), node_watch=watch)
        reads = len(proxy.requests)
        seen = read_all(adapter, nodes)
        assert [seen[n].view.name for n in nodes if seen[n].view] == nodes
        assert len(proxy.requests) == reads  # no GET: every view came from the store

        # Each read right after healer's own write, while the watch's events come 0.3 s behind
        # the answers: the node is then read with a GET, never taken from the store as it was
        # before the write.
        proxy.watch_lag = 0.3
        for i in range(10):
            own = Ownership(incident_id=i + 1, reason="GpuTooHot", at=datetime.now(UTC))
            assert adapter.cordon(nodes[0], own).unschedulable
            view = read_all(adapter, nodes)[nodes[0]].view
            assert view is not None and view.unschedulable, (
                f"round {i}: the store's view from before the cordon"
            )
            assert not adapter.release(nodes[0]).unschedulable
            view = read_all(adapter, nodes)[nodes[0]].view
            assert view is not None and not view.unschedulable, f"round {i}: the view from before the release"
        # Once the watch has delivered them, the store serves that node again: no GET.
        proxy.watch_lag = 0.0
        wait_until(lambda: not watch.behind([nodes[0]]), timeout=30, what="the writes' events")
        reads = len(proxy.requests)
        assert not read_all(adapter, nodes)[nodes[0]].view.unschedulable  # type: ignore[union-attr]
        assert len(proxy.requests) == reads
    finally:
        watch.stop()
        for name in nodes:
            k8s.CoreV1Api(kube.admin_client()).delete_node(name)
