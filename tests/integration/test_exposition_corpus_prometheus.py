"""The default rule pack against exporter outputs people published, on one real Prometheus.

``tests/fixtures/exposition-corpus/`` holds reconstructions of ``/metrics`` outputs from public
issues (each file's header says where from, which exporter, what was kept and what was changed):
H100s with pod labels on some GPUs only, MIG on A30/A100/H100, a GPU time-sliced between three pods
behind a ServiceMonitor, ``Hostname``/``hostname`` holding the exporter pod's name, a vGPU guest,
2.x and 1.x exporters, the Xid label shapes, node_exporter on RoCE and InfiniBand HCAs; and
healer's own agent on a real H200, idle and power-capped at full load (docs/device-checks/).
``verdicts.yaml`` beside them says, written by hand from the rules, what every default rule must
return for each Kubernetes node.

All samples are scraped by one Prometheus (one job per sample, the target labels a real scrape
job would add). Every rule's ``expr`` runs as healer runs it; each result series is given its node
as healer gives it, through an address book of the test's cluster
(:func:`healer.model.addresses.build_address_book`): a ``Hostname`` naming an exporter pod names
that pod's node, a node_exporter series without a node label names the node at its ``instance``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import yaml

from healer.blind_spots import observe_blind_spots
from healer.engine.labels import clean_labels, clean_node_name
from healer.model.addresses import AddressBook, build_address_book, instance_host
from healer.ruleset.loading import load_ruleset
from healer.sources.prometheus import PrometheusSource
from tests.conftest import FIXTURES, REPO
from tests.exposition import Pages, load_pack, serve, target_of
from tests.services import PrometheusServer, ScrapeTarget, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

CORPUS = FIXTURES / "exposition-corpus"
SAMPLES: dict[str, dict[str, Any]] = yaml.safe_load((CORPUS / "verdicts.yaml").read_text())["samples"]

#: {node: {rule: {GPU index or "device:port": [value of each series]}}}
Found = dict[str, dict[str, dict[str | None, list[str]]]]


@dataclass
class Corpus:
    prom: PrometheusServer
    book: AddressBook
    found: Found
    unresolved: list[tuple[str, dict[str, str], str | None]]  # rule, labels, why
    scrape_errors: dict[str, str]  # sample: Prometheus's lastError


def address_book() -> AddressBook:
    """The test's cluster: every sample's nodes (name, InternalIP) and exporter pods (name, node; the
    pod's IP is its scrape address)."""
    nodes: list[tuple[str, list[str]]] = []
    pods: list[tuple[str, list[str]]] = []
    pod_names: list[tuple[str, str]] = []
    for sample in SAMPLES.values():
        cluster = sample["cluster"]
        nodes += [(node, [ip]) for node, ip in cluster["nodes"].items()]
        for pod, node in cluster.get("exporter_pods", {}).items():
            pod_names.append((pod, node))
            pods.append((node, [instance_host(sample["scrape"]["labels"]["instance"])]))
    return build_address_book(nodes=nodes, pods=pods, pod_names=pod_names)


def scrape_errors(prom: PrometheusServer) -> dict[str, str] | None:
    """{sample: Prometheus's last error} of the samples whose scrape failed, once every sample was
    scraped; None before."""
    targets = httpx.get(f"{prom.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    if len(targets) < len(SAMPLES) or any(t["health"] == "unknown" for t in targets):
        return None
    return {t["scrapeUrl"].rsplit("/", 1)[1]: t["lastError"] for t in targets if t["health"] != "up"}


def evaluate(prom: PrometheusServer, book: AddressBook, errors: dict[str, str], exclude: str = "") -> Corpus:
    """Every rule of the default pack (``exclude``: the operator's HCA exclude pattern), each result
    series given its node as healer gives it."""
    found: Found = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    unresolved: list[tuple[str, dict[str, str], str | None]] = []
    for name, rule in load_pack(exclude).items():
        for series in prom.query(rule.expr):
            labels, _ = clean_labels({k: v for k, v in series["metric"].items() if k != "__name__"})
            resolved = book.resolve(labels, rule.node_labels)
            if resolved.node is None:
                unresolved.append((name, labels, resolved.why))
                continue
            found[clean_node_name(resolved.node)][name][target_of(labels, rule)].append(series["value"][1])
    return Corpus(prom, book, found, unresolved, errors)


@pytest.fixture(scope="module")
def corpus() -> Iterator[Corpus]:
    pages = Pages({f"/{name}": (CORPUS / name).read_text() for name in SAMPLES})
    with serve(pages) as address:
        scrape = [
            ScrapeTarget(address, f"/{name}", labels=dict(s["scrape"]["labels"]), job=s["scrape"]["job"])
            for name, s in SAMPLES.items()
        ]
        with prometheus_server(scrape) as prom:
            wait_until(lambda: scrape_errors(prom) is not None, what="every sample scraped once")
            errors = scrape_errors(prom) or {}
            # A scrape commits its samples with its `up` series: once `up` is 1, the sample is queryable.
            prom.wait_for_targets_up(len(SAMPLES) - len(errors))
            yield evaluate(prom, address_book(), errors)


def test_every_sample_is_scraped(corpus: Corpus) -> None:
    assert corpus.scrape_errors == {}


def test_every_finding_names_a_node_of_the_corpus(corpus: Corpus) -> None:
    """No series resolves to nothing or to a name that is no node (an exporter pod's, a host's)."""
    assert corpus.unresolved == []
    nodes = {node for sample in SAMPLES.values() for node in sample["cluster"]["nodes"]}
    assert set(corpus.found) <= nodes, sorted(set(corpus.found) - nodes)


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_verdict_per_node(corpus: Corpus, sample: str) -> None:
    assert sample not in corpus.scrape_errors, corpus.scrape_errors[sample]
    verdict = SAMPLES[sample]["verdict"]
    assert set(verdict) == set(SAMPLES[sample]["cluster"]["nodes"]), "a verdict for every node of the sample"
    for node, expected in verdict.items():
        got = {rule: dict(where) for rule, where in corpus.found.get(node, {}).items()}
        want = {
            rule: {target: [value] for target, value in where.items()} for rule, where in expected.items()
        }
        assert got == want, f"{sample}: {node}"


def test_excluding_the_unplugged_roce_functions_silences_them(corpus: Corpus) -> None:
    """The remedy rules/README.md gives for ports unused on purpose, on the published RoCE names
    (case matters: ``roceP2p1s0f1`` and ``rocep1s0f1``)."""
    excluded = evaluate(corpus.prom, corpus.book, {}, exclude="roce[Pp].*s0f1")
    assert "spark-01" not in excluded.found
    assert set(excluded.found) == set(corpus.found) - {"spark-01"}


def test_blind_spots_show_what_the_pack_cannot_see(corpus: Corpus) -> None:
    """The vGPU guest (no temperature) is blind for the rules counting GPUs by their temperature;
    healer's agent alone (no profiling fields) for the tensor-activity rule; the 1.x exporter
    (``dcgm_*`` names, nothing the pack reads) is blind as a whole GPU node."""
    gpu_nodes = [
        node
        for name, sample in SAMPLES.items()
        if not name.startswith(("roce", "mlx5"))
        for node in sample["cluster"]["nodes"]
    ]
    report = observe_blind_spots(
        ruleset=load_ruleset([REPO / "rules"]),
        source=PrometheusSource(corpus.prom.url),
        now=datetime.now(UTC),
        book=corpus.book,
        gpu_nodes=gpu_nodes,
    )
    spots = {(s.node, s.rule, s.scope) for s in report.spots}
    hot = {(node, scope) for node, rule, scope in spots if rule == "GpuTooHot"}
    assert hot == {("k8s-vgpu-worker-1", "node"), ("legacy-gpu-1", "node")}
    assert {rule for node, rule, _ in spots if node == "k8s-vgpu-worker-1"} >= {
        "GpuMissing",
        "DcgmExporterSilent",
    }
    # The published mlx5 pair lacks four of the error counters the pack reads; the RoCE node has them all.
    infiniband = {(node, rule) for node, rule, _ in spots if rule.startswith("Infiniband")}
    assert infiniband == {
        ("rdma-worker-2", rule)
        for rule in (
            "InfinibandBufferOverrun",
            "InfinibandLinkErrorRecovery",
            "InfinibandLinkIntegrityErrors",
            "InfinibandPortReceiveErrors",
        )
    }
    # healer's own agent on a real H200 reads NVML, which has no DCGM profiling fields: only the
    # tensor-activity rule is blind there, and says so.
    h200 = {(node, rule) for node, rule, _ in spots if node.startswith("gpu-h200")}
    assert h200 == {("gpu-h200-01", "GpuSilentThrottling"), ("gpu-h200-02", "GpuSilentThrottling")}
    assert report.unresolved == () and report.errors == ()
