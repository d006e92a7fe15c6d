"""Which node a series names, checked against the real control plane (tests/kube_cluster.py) as
healer's ServiceAccount under the chart's ClusterRole, with a real Prometheus scraping the real
node_exporter (Debian's, on a fake sysfs) with no node label, and a static dcgm-exporter page.

node_exporter adds no node label and the node-exporter chart adds no relabeling, so a series says
only ``instance="<pod or host IP>:9100"`` (reference: exporters-real.md). The one node_exporter is
scraped three times under three ``instance`` values, as three nodes' exporters would be:

- ``10.77.<n>.5:9100``: a KWOK node's InternalIP (set in its status; hostNetwork exporters);
- ``<podIP>:9100``: a node-exporter pod KWOK runs on another node (pod network);
- ``10.99.<n>.1:9100``: an address no Node and no exporter pod has: the rule is degraded, and
  ``healer evaluate --once`` says so and exits 2.

dcgm-exporter's ``Hostname`` label holds its own pod's name, not the node's. The page is scraped
twice, at addresses no pod or node has:

- ``Hostname="dcgm-exporter-<tag>"``: a pod of that name (the settings' exporter selector) bound to a
  third KWOK node: the series is that node's;
- ``Hostname="dcgm-exporter-zz<tag>"``: names no Node and no pod: unresolved, with the reason, and
  nothing acts on it.

Then ``healer run`` (acting, not dry-run) quarantines the three resolved nodes on the real control
plane, records nothing about the name that is no node, and its ``/metrics`` and Rules page say the
rules are degraded.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client import ApiClient

from healer.actions.addresses import KubernetesAddresses
from healer.clock import utc_now
from healer.config import KubernetesSettings
from healer.detection import initial_state as no_state
from healer.detection import run_detection
from healer.model.states import RuleHealth
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.sources.prometheus import PrometheusSource
from tests.exposition import Pages, serve
from tests.helm import NAMESPACE
from tests.kube_cluster import ControlPlane
from tests.node_exporter import node_exporter
from tests.services import PrometheusServer, ScrapeTarget, free_port, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
RULE = "InfinibandPortNotActive"
SELECTOR = KubernetesSettings().exporter_pod_selector  # the default: node-exporter and dcgm-exporter
GPU_RULE = "GpuTooHot"
#: The pack's GpuTooHot keeps no ``instance``; this one does, so the reason can name the address.
GPU_RULE_BODY = {
    "name": GPU_RULE,
    "expr": "max by (Hostname, gpu, UUID, instance) (DCGM_FI_DEV_GPU_TEMP) > 78",
    "for": "5m",
    "severity": "critical",
    "annotations": {"summary": "GPU {{ $labels.gpu }} at {{ $value }} C"},
}
DCGM_PAGE = 'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="GPU-{uuid}",Hostname="{hostname}"}} 91\n'


@dataclass
class Scene:
    prom: PrometheusServer
    hostnet_node: str  # named by its InternalIP
    podnet_node: str  # named by its node-exporter pod's IP
    instances: dict[str, str]  # role -> instance label value
    kubeconfig: Path
    dcgm_node: str  # named by its dcgm-exporter pod's name in Hostname
    dcgm_pod: str
    nameless: str  # a Hostname that names no Node and no pod

    @property
    def nodes(self) -> set[str]:
        return {self.hostnet_node, self.podnet_node, self.dcgm_node}


def _ruleset() -> RuleSet:
    pack = load_ruleset([REPO / "rules"])
    gpu = RuleGroup(name="gpu", rules=[Rule.model_validate(GPU_RULE_BODY)])
    ib = tuple(g for g in pack.groups if g.name == "infiniband")
    return RuleSet(groups=(*ib, gpu), sources=pack.sources)


def _gpu_rule_file(path: Path, **overrides: object) -> Path:
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "gpu", "interval": "2s", "rules": [GPU_RULE_BODY | overrides]}]})
    )
    return path


@pytest.fixture(scope="module")
def scene(
    kube: ControlPlane, kube_healer_token: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scene]:
    tag = uuid.uuid4().hex[:6]
    octet = int(tag[:2], 16)  # apart from other modules' addresses on the same control plane
    hostnet, podnet, dcgm_node = f"ib-host-{tag}", f"ib-pod-{tag}", f"gpu-dcgm-{tag}"
    dcgm_pod, nameless = f"dcgm-exporter-{tag}", f"dcgm-exporter-zz{tag}"
    kube.add_nodes([hostnet, podnet, dcgm_node])
    with kube.admin_client() as api:
        core = k8s.CoreV1Api(api)
        internal = f"10.77.{octet}.5"
        core.patch_node_status(
            hostnet,
            {
                "status": {
                    "addresses": [
                        {"type": "InternalIP", "address": internal},
                        {"type": "Hostname", "address": hostnet},
                    ]
                }
            },
        )
        pod = k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(
                name=f"node-exporter-{tag}", labels={"app.kubernetes.io/name": "prometheus-node-exporter"}
            ),
            spec=k8s.V1PodSpec(
                node_name=podnet,
                containers=[k8s.V1Container(name="node-exporter", image="quay.io/prometheus/node-exporter")],
                termination_grace_period_seconds=0,
            ),
        )
        core.create_namespaced_pod("default", pod)
        exporter = k8s.V1Pod(  # as the dcgm-exporter chart's DaemonSet makes them
            metadata=k8s.V1ObjectMeta(name=dcgm_pod, labels={"app.kubernetes.io/name": "dcgm-exporter"}),
            spec=k8s.V1PodSpec(
                node_name=dcgm_node,
                containers=[k8s.V1Container(name="exporter", image="nvcr.io/nvidia/k8s/dcgm-exporter")],
                termination_grace_period_seconds=0,
            ),
        )
        core.create_namespaced_pod("default", exporter)
        running = wait_until(
            lambda: (p := core.read_namespaced_pod(pod.metadata.name, "default")).status.pod_ip and p,
            timeout=60,
            what="the node-exporter pod's IP",
        )
        pod_ip = running.status.pod_ip
        # KWOK keeps the addresses a node's status already has (its heartbeat re-sends them).
        wait_until(
            lambda: any(a.address == internal for a in core.read_node(hostnet).status.addresses or []),
            timeout=30,
            what="the InternalIP",
        )
    instances = {
        "hostnet": f"{internal}:9100",
        "podnet": f"{pod_ip}:9100",
        "nowhere": f"10.99.{octet}.1:9100",
        "dcgm": f"10.98.{octet}.2:9400",  # scraped through an address no pod or node has
        "nameless": f"10.98.{octet}.1:9400",
    }
    pages = Pages(
        {
            "/dcgm": DCGM_PAGE.format(uuid=tag, hostname=dcgm_pod),
            "/nameless": DCGM_PAGE.format(uuid=f"{tag}-2", hostname=nameless),
        }
    )
    with node_exporter() as ib, serve(pages) as dcgm:
        ib.sysfs.add_hca("mlx5_0")
        ib.sysfs.set_state("mlx5_0", 1)  # port DOWN on every "node": InfinibandPortNotActive fires
        targets = [
            ScrapeTarget(ib.address, labels={"instance": instances[role]}, job="node-exporter")
            for role in ("hostnet", "podnet", "nowhere")
        ] + [
            ScrapeTarget(dcgm, metrics_path=f"/{role}", labels={"instance": instances[role]}, job="dcgm")
            for role in ("dcgm", "nameless")
        ]
        with prometheus_server(targets) as prom:
            prom.wait_for_targets_up(5)
            prom.wait_for_samples("count(node_infiniband_state_id) == 3")
            prom.wait_for_samples("count(DCGM_FI_DEV_GPU_TEMP) == 2")
            kubeconfig = kube.kubeconfig(
                kube_healer_token, tmp_path_factory.mktemp("kube") / "healer.kubeconfig"
            )
            yield Scene(prom, hostnet, podnet, instances, kubeconfig, dcgm_node, dcgm_pod, nameless)
    with kube.admin_client() as api:
        core = k8s.CoreV1Api(api)
        for name in (f"node-exporter-{tag}", dcgm_pod):
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        for name in (hostnet, podnet, dcgm_node):
            core.delete_node(name)


def test_series_with_only_instance_fire_on_their_nodes(scene: Scene, kube_healer_api: ApiClient) -> None:
    settings = KubernetesSettings(exporter_pod_selector=SELECTOR)
    addresses = KubernetesAddresses(kube_healer_api, settings)  # as healer: the chart's ClusterRole
    with PrometheusSource(scene.prom.url, timeout_seconds=5) as source:
        result = run_detection(
            ruleset=_ruleset(),
            source=source,
            session_factory=None,
            state=no_state(None),
            now=utc_now(),
            addresses=addresses.address_book,
        )
    report = {r.rule: r for r in result.reports}[RULE]
    pending = {
        node: [f.labels["instance"] for f in fs if f.rule == RULE]
        for node, fs in result.findings.pending.items()
    }
    assert pending[scene.hostnet_node] == [scene.instances["hostnet"]]
    assert pending[scene.podnet_node] == [scene.instances["podnet"]]
    assert report.by_address == 2
    # The third names no node: reported, never a silent ok.
    assert report.health == RuleHealth.DEGRADED
    assert report.unresolved is not None
    assert (report.unresolved.count, report.unresolved.example_instance) == (1, scene.instances["nowhere"])
    assert f"no exporter pod IP is {scene.instances['nowhere'].split(':')[0]}" in str(report.unresolved)

    # dcgm-exporter's Hostname is its pod's name: the series is the pod's node's.
    gpu = {r.rule: r for r in result.reports}[GPU_RULE]
    hot = {
        node: [f.labels["Hostname"] for f in fs if f.rule == GPU_RULE]
        for node, fs in result.findings.pending.items()
    }
    assert hot[scene.dcgm_node] == [scene.dcgm_pod]
    assert (gpu.by_pod, gpu.by_address) == (1, 0)
    # A Hostname that names no Node and no pod, at an unknown address: reported, no finding.
    assert set(result.findings.pending) == scene.nodes
    assert gpu.health == RuleHealth.DEGRADED
    assert gpu.unresolved is not None
    assert gpu.unresolved.count == 1
    assert gpu.unresolved.why == (
        f"Hostname {scene.nameless!r} names no Node and no exporter pod; "
        f"instance {scene.instances['nameless']} matches no pod or node address"
    )


def test_evaluate_once_and_backtest_report_degraded_and_exit_2(scene: Scene, tmp_path: Path) -> None:
    gpu_rules = _gpu_rule_file(tmp_path / "gpu.yaml")
    env = {
        **os.environ,
        "HEALER_PROMETHEUS__URL": scene.prom.url,
        "HEALER_RULES_PATHS": json.dumps([str(REPO / "rules" / "infiniband.yaml"), str(gpu_rules)]),
        "HEALER_KUBERNETES__KUBECONFIG": str(scene.kubeconfig),
        "HEALER_KUBERNETES__EXPORTER_POD_SELECTOR": SELECTOR,
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)

    def cli(
        *args: str, command: tuple[str, ...] = ("evaluate", "--once", "--no-store")
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "healer", *command, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = cli("-o", "json")
    assert done.returncode == 2, done.stderr
    out = json.loads(done.stdout)
    nodes = {f["node"] for f in out["findings"] if f["rule"] == RULE}
    assert nodes == {scene.hostnet_node, scene.podnet_node}
    rule = next(r for r in out["rules"] if r["rule"] == RULE)
    assert rule["health"] == "degraded"
    assert (rule["unresolved"]["count"], rule["unresolved"]["example_instance"]) == (
        1,
        scene.instances["nowhere"],
    )
    assert [f["node"] for f in out["findings"] if f["rule"] == GPU_RULE] == [scene.dcgm_node]
    gpu = next(r for r in out["rules"] if r["rule"] == GPU_RULE)
    assert gpu["health"] == "degraded"
    assert gpu["unresolved"]["example"]["Hostname"] == scene.nameless
    assert gpu["unresolved"]["why"].startswith(
        f"Hostname {scene.nameless!r} names no Node and no exporter pod"
    )

    table = cli()
    assert table.returncode == 2, table.stderr
    line = next(x for x in table.stdout.splitlines() if x.startswith(RULE))
    assert line.split()[2] == "degraded"
    assert f"{RULE}: 1 series, e.g. instance={scene.instances['nowhere']}" in table.stdout
    assert f"{GPU_RULE}: 1 series, e.g. instance={scene.instances['nameless']}" in table.stdout
    assert f"1 series that name no node (Hostname {scene.nameless!r} names no Node" in table.stdout

    # The backtest resolves as evaluate does (the cluster of now): same rules degraded, same reason.
    env["HEALER_DATABASE__URL"] = "sqlite://"
    replayed = cli("-o", "json", command=("backtest", "--from", "-1m", "--to", "now", "--step", "5s"))
    assert replayed.returncode == 2, replayed.stderr
    rules = {r["rule"]: r for r in json.loads(replayed.stdout[replayed.stdout.index("{") :])["rules"]}
    assert {name for name, r in rules.items() if r["unresolved"]} == {RULE, GPU_RULE}
    assert rules[GPU_RULE]["unresolved"]["why"] == gpu["unresolved"]["why"]
    assert rules[GPU_RULE]["unresolved"]["series"] == 1


def test_healer_run_quarantines_the_nodes_it_resolved_and_reports_the_rest(
    scene: Scene, tmp_path: Path, kube_admin: ApiClient
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    pack = (REPO / "rules" / "infiniband.yaml").read_text()
    only = {"groups": [{"name": "infiniband", "interval": "2s", "rules": []}]}
    for rule in yaml.safe_load(pack)["groups"][0]["rules"]:
        if rule["name"] == RULE:  # acted on at once, quarantine only (no drain, no ticket)
            only["groups"][0]["rules"].append({**rule, "for": "0s", "actions": ["quarantine"]})
    (rules / "ib.yaml").write_text(yaml.safe_dump(only))
    _gpu_rule_file(rules / "gpu.yaml", **{"for": "0s", "actions": ["quarantine"]})
    port = free_port()
    config = tmp_path / "healer.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "rules_paths": [str(rules)],
                "database": {"url": f"sqlite:///{tmp_path / 'healer.db'}"},
                "prometheus": {"url": scene.prom.url, "tick_deadline_seconds": 5},
                "kubernetes": {
                    "kubeconfig": str(scene.kubeconfig),
                    "namespace": NAMESPACE,
                    "lease_name": f"healer-{uuid.uuid4().hex[:6]}",
                    "renew_interval_seconds": 1,
                    "exporter_pod_selector": SELECTOR,
                },
                "safety": {
                    "dry_run": False,
                    "max_unhealthy": 10,
                    "max_unhealthy_percent": 100,
                    "breaker_nodes": 10,
                    "breaker_percent": 100,
                },
                "api": {"port": port, "anonymous_role": "viewer"},  # the page is read without a token
            }
        )
    )
    log = tmp_path / "healer.log"
    env = {key: value for key, value in os.environ.items() if key != "KUBERNETES_SERVICE_HOST"}
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "healer", "--config", str(config), "run", "--upgrade-db"],
            stdout=out,
            stderr=out,
            env={**env, "POD_NAME": "healer-by-address"},
        )
    core = k8s.CoreV1Api(kube_admin)
    try:

        def cordoned() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"healer run exited {process.returncode}:\n{log.read_text()[-3000:]}")
            return all(core.read_node(n).spec.unschedulable for n in scene.nodes)

        wait_until(cordoned, timeout=90, what="the three resolved nodes cordoned by healer run")
        base = f"http://127.0.0.1:{port}"
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        samples = dict(re.findall(r"^(\S+) (\S+)$", metrics, flags=re.M))
        assert samples[f'healer_rule_health{{health="degraded",rule="{RULE}"}}'] == "1.0"
        nowhere = scene.instances["nowhere"]
        assert (
            samples[f'healer_rule_unresolved_series{{example_instance="{nowhere}",rule="{RULE}"}}'] == "1.0"
        )
        nameless = scene.instances["nameless"]
        assert (
            samples[f'healer_rule_unresolved_series{{example_instance="{nameless}",rule="{GPU_RULE}"}}']
            == "1.0"
        )
        assert samples[f'healer_rule_health{{health="degraded",rule="{GPU_RULE}"}}'] == "1.0"
        page = httpx.get(f"{base}/rules", timeout=10).text
        assert '<span class="health health-degraded">degraded</span>' in page
        assert "1 series without a node label" in page
        assert f"1 series that name no node (Hostname {scene.nameless!r}" in html.unescape(page)
        # The name that is no node became no finding and no node of healer's.
        findings = httpx.get(f"{base}/api/v1/findings", timeout=10).json()["items"]
        assert {f["node_name"] for f in findings} == scene.nodes
        listed = {n["name"] for n in httpx.get(f"{base}/api/v1/nodes", timeout=10).json()["items"]}
        assert scene.nameless not in listed and scene.dcgm_pod not in listed
    finally:
        process.terminate()
        process.wait(timeout=30)
        for name in scene.nodes:
            core.patch_node(name, {"spec": {"unschedulable": False}})
