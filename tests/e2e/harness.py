"""The world of a `healer run` end-to-end test: the fleet simulator scraped by a real Prometheus,
KWOK nodes, namespaces and workloads on the real control plane (``tests/kube_cluster.py``), a
kubeconfig for healer's ServiceAccount (the chart's RBAC, not admin), the settings file and the
``healer run`` processes.

The control plane is shared by every test of an xdist worker, so a test's :class:`World` names
everything after a prefix of its own: nodes (``<prefix>-gpu-00``...), namespaces, the pool label
value, healer's Lease and healer's domain (its taint, annotations), so neither the budgets' pools
nor the ownership reconcile see another test's nodes. :meth:`World.cleanup` deletes what it made.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from healer.store.session import make_engine, make_sessionmaker
from healer_dev.simulator.fleet import Fleet, FleetConfig
from healer_dev.simulator.scenario import parse_scenario
from healer_dev.simulator.server import ElapsedClock, SimulatorServer
from tests.kube_cluster import ControlPlane
from tests.kube_proxy import ApiProxy
from tests.services import PrometheusServer, free_port, prometheus_server, wait_until

HEALER_NAMESPACE = "healer-system"  # the chart's release namespace: its Role grants Leases there
POOL_LABEL = "node.kubernetes.io/instance-type"
GROUP_LABEL = "healer-e2e/group"  # every node of one test, for workloads' nodeSelectors
PROVIDER_SECRET_ENV = "HEALER_TEST_PROVIDER_SECRET"
PROVIDER_SECRET = "provider-secret-for-tests"


def hot_gpu_rules(actions: str, *, hold: str = "2s", summary: str = "GPU {{ $labels.gpu }} too hot") -> str:
    """A rule file with one rule, GpuTooHot (a GPU above 78 C for ``hold``), taking ``actions``
    (YAML flow, e.g. ``[quarantine, {drain: {timeout: 10m}}]``), evaluated every second."""
    return f"""
groups:
  - name: thermal
    interval: 1s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: {hold}
        unit: degrees C
        annotations: {{summary: "{summary}"}}
        actions: {actions}
"""


def condition(view: Mapping[str, Any]) -> str | None:
    """The status of healer's ``GpuHealthy`` condition on a Node as JSON (None: not set)."""
    found = [c for c in view.get("status", {}).get("conditions", []) if c["type"] == "GpuHealthy"]
    return found[0]["status"] if found else None


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, nested mappings key by key."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class Healer:
    """One ``healer run`` process; its output goes to ``log``."""

    process: subprocess.Popen[bytes]
    log: Path
    identity: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> None:
        """Raise (with the log's end) when the process has exited."""
        if self.process.poll() is not None:
            raise AssertionError(f"healer run exited {self.process.returncode}:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self, timeout: float = 60) -> int | None:
        """SIGCONT (in case it is frozen) and SIGTERM; SIGKILL when it does not exit in ``timeout``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            return None


@dataclass
class Metrics:
    """The fleet simulator and the Prometheus scraping it."""

    prometheus: PrometheusServer
    fleet: Fleet
    clock: ElapsedClock

    @property
    def url(self) -> str:
        return self.prometheus.url

    def cool(self, node: str) -> None:
        """End ``node``'s faults now (the simulator's repair: healthy values from now on)."""
        assert self.fleet.repair(node, self.clock()) > 0, f"{node} had no fault to end"


@dataclass
class World:
    """One test's simulator, Prometheus, cluster objects and healer processes (see module doc)."""

    tmp_path: Path
    kube: ControlPlane
    token: str
    prefix: str = field(default_factory=lambda: f"e2e-{uuid.uuid4().hex[:6]}")
    healers: list[Healer] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    engines: list[Engine] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.api = self.kube.admin_client()
        self.core = k8s.CoreV1Api(self.api)
        self.rules_dir = self.tmp_path / "rules"
        self.rules_dir.mkdir(exist_ok=True)

    # -- names ------------------------------------------------------------------------------------

    @property
    def domain(self) -> str:
        """healer's domain in this test (taint key, annotations): ``<prefix>.healer.dev``."""
        return f"{self.prefix}.healer.dev"

    @property
    def lease(self) -> str:
        return f"{self.prefix}-leader"

    def node_name(self, index: int) -> str:
        """The simulator's and the cluster's name of node ``index`` (``<prefix>-gpu-01``)."""
        return f"{self.prefix}-gpu-{index:02d}"

    # -- the cluster ----------------------------------------------------------------------------------

    def add_nodes(
        self,
        count: int,
        *,
        pool: str,
        start: int = 0,
        gpus: int = 8,
        role: str = "gpu",
        labels: Mapping[str, str] | None = None,
    ) -> list[str]:
        """KWOK nodes ``<test prefix>-<role>-NN`` labelled with pool ``pool`` (none when empty) and
        ``labels``."""
        names = [f"{self.prefix}-{role}-{i:02d}" for i in range(start, start + count)]
        labels = {GROUP_LABEL: self.prefix, **({POOL_LABEL: pool} if pool else {}), **(labels or {})}
        self.nodes.extend(names)
        self.kube.add_nodes(names, gpus=gpus, labels=labels)
        return names

    def namespace(self, name: str) -> str:
        """Create namespace ``<prefix>-<name>``; return its name."""
        full = f"{self.prefix}-{name}"
        self.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=full)))
        self.namespaces.append(full)
        return full

    def node(self, name: str) -> dict[str, Any]:
        """The Node as JSON (what ``kubectl get node -o json`` shows)."""
        return dict(self.api.sanitize_for_serialization(self.core.read_node(name)))

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod as JSON, or None when it is gone or terminating."""
        try:
            got = self.core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        if got.metadata.deletion_timestamp is not None:
            return None
        return dict(self.api.sanitize_for_serialization(got))

    def running(self, namespace: str, name: str) -> bool:
        pod = self.pod(namespace, name)
        return bool(pod and pod["status"].get("phase") == "Running")

    def stateful_set(self, namespace: str, name: str, *, node: str, empty_dir: bool = False) -> str:
        """A one-replica StatefulSet pinned to ``node``; waits for its pod ``<name>-0`` Running and
        returns ``namespace/<name>-0``. A replacement after an eviction stays Pending on a cordoned
        node (the pin), so the drain sees exactly one pod."""
        labels = {"app": name}
        spec: dict[str, Any] = {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        }
        if empty_dir:
            spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
            spec["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
        body = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name},
            "spec": {
                "replicas": 1,
                "serviceName": name,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": spec},
            },
        }
        k8s.AppsV1Api(self.api).create_namespaced_stateful_set(namespace, body)
        wait_until(
            lambda: self.running(namespace, f"{name}-0"), timeout=90, what=f"{namespace}/{name}-0 Running"
        )
        return f"{namespace}/{name}-0"

    def deployment(self, namespace: str, name: str, *, replicas: int, node: str) -> list[str]:
        """A Deployment of ``replicas`` pods pinned to ``node`` (its hostname label); waits until
        every replica runs and returns their ``namespace/name``. A replacement after an eviction
        stays Pending while the node is cordoned, so a budget over them allows the next eviction
        only once the node is schedulable again."""
        labels = {"app": name}
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            },
        }
        k8s.AppsV1Api(self.api).create_namespaced_deployment(namespace, body)

        def running() -> list[str] | None:
            pods = self.core.list_namespaced_pod(namespace, label_selector=f"app={name}").items
            up = [p for p in pods if p.status.phase == "Running" and p.spec.node_name == node]
            return [f"{namespace}/{p.metadata.name}" for p in up] if len(up) == replicas else None

        found: list[str] = wait_until(running, timeout=90, what=f"{replicas} pods of {name} on {node}")
        return found

    def daemon_set(self, namespace: str, name: str) -> None:
        """A DaemonSet on every node of this test; waits until each node runs its pod."""
        labels = {"app": name}
        body = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {GROUP_LABEL: self.prefix},
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            },
        }
        k8s.AppsV1Api(self.api).create_namespaced_daemon_set(namespace, body)

        def everywhere() -> bool:
            pods = self.core.list_namespaced_pod(namespace, label_selector=f"app={name}").items
            on = {p.spec.node_name for p in pods if p.status.phase == "Running"}
            return set(self.nodes) <= on

        wait_until(everywhere, timeout=90, what=f"DaemonSet {name} on every node")

    def daemon_pod(self, namespace: str, name: str, node: str) -> str:
        """The name of DaemonSet ``name``'s pod on ``node``."""
        pods = self.core.list_namespaced_pod(
            namespace, label_selector=f"app={name}", field_selector=f"spec.nodeName={node}"
        )
        [pod] = pods.items
        return str(pod.metadata.name)

    def budget(self, namespace: str, name: str, *, app: str, **spec: int) -> None:
        """Create or replace PodDisruptionBudget ``name`` over ``app=<app>`` (``min_available=`` or
        ``max_unavailable=``) and wait until the disruption controller has observed it."""
        policy = k8s.PolicyV1Api(self.api)
        body = k8s.V1PodDisruptionBudget(
            metadata=k8s.V1ObjectMeta(name=name),
            spec=k8s.V1PodDisruptionBudgetSpec(
                selector=k8s.V1LabelSelector(match_labels={"app": app}), **spec
            ),
        )
        try:
            policy.create_namespaced_pod_disruption_budget(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = policy.read_namespaced_pod_disruption_budget(name, namespace)
            body.metadata.resource_version = current.metadata.resource_version
            policy.replace_namespaced_pod_disruption_budget(name, namespace, body)

        def observed() -> bool:
            got = policy.read_namespaced_pod_disruption_budget(name, namespace)
            return bool(
                got.status and (got.status.observed_generation or 0) >= (got.metadata.generation or 0)
            )

        wait_until(observed, timeout=60, what=f"budget {namespace}/{name} observed")

    def lease_object(self) -> k8s.V1Lease | None:
        """healer's Lease as the API server holds it (None when not created)."""
        try:
            return k8s.CoordinationV1Api(self.api).read_namespaced_lease(self.lease, HEALER_NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def lease_holder(self) -> str | None:
        """The holder of healer's Lease now (None when released or not yet created)."""
        lease = self.lease_object()
        return (lease.spec.holder_identity or None) if lease is not None else None

    def events_by(self, instance: str, node: str) -> list[str]:
        """Names of the Events about ``node`` reported by healer ``instance`` (healer writes
        ``events.k8s.io/v1``; read through core/v1, the same objects, as ``kubectl describe`` does)."""
        selector = f"involvedObject.kind=Node,involvedObject.name={node}"
        events = self.core.list_namespaced_event("default", field_selector=selector).items
        return sorted(str(e.metadata.name) for e in events if e.reporting_instance == instance)

    # -- Prometheus and the simulator ------------------------------------------------------------

    @contextlib.contextmanager
    def metrics(
        self,
        nodes: int,
        scenario: str,
        *,
        wait_for: str | None = None,
        scrape_interval: str = "1s",
        rule_files: Sequence[Path] = (),
        alertmanagers: Sequence[str] = (),
    ) -> Iterator[Metrics]:
        """The fleet simulator (``nodes`` nodes named as :meth:`node_name`, ``scenario``) scraped
        every ``scrape_interval`` by a real Prometheus; waits until ``wait_for`` (PromQL) has samples.
        Prometheus evaluates ``rule_files`` (alerts mode) and sends their alerts to ``alertmanagers``
        (host:port each)."""
        config = FleetConfig(nodes=nodes, node_prefix=f"{self.prefix}-gpu-")
        fleet = Fleet(config, parse_scenario(scenario))
        clock = ElapsedClock()
        with SimulatorServer(fleet, clock=clock) as simulator:
            sd = simulator.write_file_sd(self.tmp_path / "targets.json")
            with prometheus_server(
                [],
                file_sd=[sd],
                scrape_interval=scrape_interval,
                rule_files=rule_files,
                alertmanagers=alertmanagers,
            ) as prometheus:
                if wait_for:
                    prometheus.wait_for_samples(wait_for, timeout=60)
                yield Metrics(prometheus, fleet, clock)

    # -- healer ---------------------------------------------------------------------------------------

    def rules(self, text: str, name: str = "thermal.yaml") -> Path:
        path = self.rules_dir / name
        path.write_text(text)
        return path

    def kubeconfig(self, proxy: ApiProxy | None = None) -> Path:
        """A kubeconfig with healer's ServiceAccount token, for the API server or through ``proxy``."""
        path = self.kube.kubeconfig(self.token, self.tmp_path / "kubeconfig")
        if proxy is not None:
            config = yaml.safe_load(path.read_text())
            config["clusters"][0]["cluster"] = {"server": proxy.url}
            path.write_text(yaml.safe_dump(config))
        return path

    def config(self, *, db: str, prometheus_url: str, proxy: ApiProxy | None = None, **extra: Any) -> Path:
        """Write healer's settings file: this test's rules, database, Prometheus, kubeconfig, Lease
        and domain, dry-run off, fast jobs; ``extra`` groups are merged in (``safety={...}``)."""
        base: dict[str, Any] = {
            "rules_paths": [str(self.rules_dir)],
            "database": {"url": db},
            "prometheus": {"url": prometheus_url, "tick_deadline_seconds": 5},
            "kubernetes": {
                "kubeconfig": str(self.kubeconfig(proxy)),
                "namespace": HEALER_NAMESPACE,
                "lease_name": self.lease,
                "domain": self.domain,
                "lease_duration_seconds": 10,
                "renew_interval_seconds": 1,
            },
            "scheduler": {"drain_interval_seconds": 1, "outbox_interval_seconds": 1},
            "safety": {"dry_run": False},
        }
        path = self.tmp_path / "healer.yaml"
        path.write_text(yaml.safe_dump(deep_merge(base, extra)))
        return path

    def start(
        self,
        config: Path,
        *,
        identity: str = "healer-e2e",
        log: str = "healer.log",
        wrapper: Sequence[str] = (),
    ) -> Healer:
        """Start ``healer run --upgrade-db`` as pod ``identity`` with its API on a free port,
        under ``wrapper`` when given (``["faketime", "-f", "+90s"]``: a replica whose clock is off)."""
        port = free_port()
        env = {
            **os.environ,
            PROVIDER_SECRET_ENV: PROVIDER_SECRET,
            "POD_NAME": identity,
            "HEALER_API__PORT": str(port),
            "HEALER_API__ANONYMOUS_ROLE": "viewer",  # the tests read the API without a token
        }
        path = self.tmp_path / log
        with path.open("ab") as out:
            process = subprocess.Popen(
                [*wrapper, sys.executable, "-m", "healer", "--config", str(config), "run", "--upgrade-db"],
                stdout=out,
                stderr=out,
                env=env,
            )
        healer = Healer(process, path, identity, port)
        self.healers.append(healer)
        return healer

    def sessions(self, url: str, healer: Healer | None = None) -> sessionmaker[Session]:
        """Sessions on healer's database (a SQLite file: waits until ``healer`` has created it)."""
        if url.startswith("sqlite:///"):

            def ready() -> bool:
                if healer is not None:
                    healer.alive()
                return Path(url.removeprefix("sqlite:///")).exists()

            wait_until(ready, timeout=30, what="healer's database")
        self.engines.append(make_engine(url))
        return make_sessionmaker(self.engines[-1])

    # -- the end ------------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop healer processes still running, dispose engines, delete namespaces and nodes."""
        for healer in self.healers:
            healer.stop()
            print(f"--- healer {healer.identity} ({healer.log.name}), the end ---\n{healer.tail()}")
        for engine in self.engines:
            engine.dispose()
        for ns in self.namespaces:
            with contextlib.suppress(ApiException):
                self.core.delete_namespace(ns)
        for name in self.nodes:
            with contextlib.suppress(ApiException):
                self.core.delete_node(name)
        with contextlib.suppress(ApiException):
            k8s.CoordinationV1Api(self.api).delete_namespaced_lease(self.lease, HEALER_NAMESPACE)
        self.api.close()
