"""A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and KWOK driving fake nodes (heartbeats, pod phases), all on loopback.

Binaries come from ``bash tests/kube/build.sh`` (Go modules pinned in ``tests/kube/*/go.mod``,
cached by version); :func:`find_binaries` returns ``None`` when they are not built. Certificates,
the service-account signing key and static tokens are generated per start in a temporary directory.
The API server authorizes with ``Node,RBAC``: the admin token is in ``system:masters``; healer's
clients authenticate as ServiceAccounts with tokens from the TokenRequest API, so RBAC holds them.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import tenacity
import urllib3
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from healer.actions.kubernetes import CONNECTIONS
from tests.services import free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "tests" / "kube" / "build.sh"
BUILD_HINT = "bash tests/kube/build.sh"
#: Annotation KWOK manages nodes by (its ``--manage-nodes-with-annotation-selector``).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
#: Lines for pytest's terminal summary (start-up time, memory); conftest prints them.
REPORT: list[str] = []
#: What the API server's audit log records: eviction requests (who, which pod, the answer's code),
#: so a test can count evictions the API server accepted as the emulator counts them; and writes to
#: Nodes (not their status) with their bodies, so a test can time a cordon where it is applied.
AUDIT_POLICY = """
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    resources:
      - group: ""
        resources: ["pods/eviction"]
  - level: Request
    verbs: ["patch", "update"]
    resources:
      - group: ""
        resources: ["nodes"]
  - level: None
"""
#: Order of start; stopped in reverse.
COMPONENTS = ("etcd", "apiserver", "controller-manager", "scheduler", "kwok")


def find_binaries() -> Path | None:
    """The directory holding ``kube`` and ``kwok`` as ``build.sh`` caches them, or None."""
    if not BUILD_SCRIPT.exists() or shutil.which("bash") is None:
        return None
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--dir"], capture_output=True, text=True, check=False
    ).stdout.strip()
    where = Path(out) if out else None
    if where is None or not (where / "kwok-stages.yaml").exists():
        return None
    if not all(os.access(where / b, os.X_OK) for b in ("kube", "kwok")):
        return None
    return where


# --- certificates ----------------------------------------------------------------------------------


def _pem_key(key: Any) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def _write_pki(where: Path) -> None:
    """``ca.crt``; ``server.crt``/``server.key`` for 127.0.0.1; ``sa.key``/``sa.pub`` (RSA)."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=2)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "healer-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    ips = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.0.0.1")]
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(
            x509.SubjectAlternativeName(
                [*(x509.DNSName(n) for n in names), *(x509.IPAddress(i) for i in ips)]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (where / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (where / "server.crt").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (where / "server.key").write_bytes(_pem_key(key))
    (where / "sa.key").write_bytes(_pem_key(sa))
    (where / "sa.pub").write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


# --- the control plane -------------------------------------------------------------------------


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Children get SIGKILL when pytest dies, so no control plane outlives a killed run."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def rss_mib(pid: int) -> float:
    """Resident memory of a process (MiB), from ``/proc/<pid>/status``; 0 when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass(frozen=True)
class Eviction:
    """One eviction request as the API server's audit log recorded it."""

    pod: str  # namespace/name
    code: int  # the answer: 201 accepted, 429 refused by a budget, ...
    user: str
    received: float = 0.0  # when the API server received it (unix seconds, microseconds)


@dataclass
class ControlPlane:
    """A running control plane. ``url``: the API server (HTTPS, loopback); ``ca_file`` verifies it."""

    url: str
    ca_file: Path
    admin_token: str
    workdir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # -- clients --

    def client(self, token: str) -> k8s.ApiClient:
        """An official-client ``ApiClient`` authenticating with a bearer ``token``."""
        configuration = k8s.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": f"Bearer {token}"}
        configuration.connection_pool_maxsize = CONNECTIONS  # as healer's own client has
        return k8s.ApiClient(configuration)

    def admin_client(self) -> k8s.ApiClient:
        """A cluster-admin client (group ``system:masters``), for test set-up only."""
        return self.client(self.admin_token)

    def kubeconfig(self, token: str, path: Path) -> Path:
        """Write a kubeconfig for ``token`` at ``path`` (what ``healer run`` is given)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "test", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}
            ],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def service_account_token(self, namespace: str, name: str) -> str:
        """A token for ServiceAccount ``namespace/name`` (created when missing), via TokenRequest."""
        with self.admin_client() as api:
            core = k8s.CoreV1Api(api)
            with contextlib.suppress(k8s.ApiException):
                core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
            with contextlib.suppress(k8s.ApiException):
                core.create_namespaced_service_account(
                    namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=name))
                )
            request = k8s.AuthenticationV1TokenRequest(
                spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=24 * 3600)
            )
            made = core.create_namespaced_service_account_token(name, namespace, request)
        return str(made.status.token)

    def apply(self, documents: Sequence[dict[str, Any]]) -> None:
        """Create objects (e.g. ``deploy/`` manifests) as admin; ones that exist are replaced."""
        with self.admin_client() as api:
            for doc in documents:
                try:
                    k8s_utils.create_from_dict(api, doc)
                except k8s_utils.FailToCreateError as exc:
                    if any(e.status != 409 for e in exc.api_exceptions):
                        raise

    # -- nodes --

    def add_nodes(self, names: Sequence[str], *, gpus: int = 8, labels: dict[str, str] | None = None) -> None:
        """Create KWOK nodes (``nvidia.com/gpu: <gpus>`` as an extended resource) and wait until
        each is Ready and schedulable (the not-ready taint removed by the node lifecycle controller)."""
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        with self.admin_client() as api:
            core = k8s.CoreV1Api(api)

            def create(name: str) -> None:
                body = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                        "labels": {
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "type": "kwok",
                            **(labels or {}),
                        },
                    },
                    "status": {"capacity": capacity, "allocatable": capacity},
                }
                # A pooled keep-alive connection the API server closed meanwhile (seen under load:
                # RemoteDisconnected) is tried again. A POST sent twice (by this retry, or by the
                # client's connection pool under load, as CI saw on a first attempt) answers 409
                # AlreadyExists: names carry the test's own prefix, so that node is this one, and
                # the wait below still checks its labels and readiness. A TLS record that fails its
                # MAC on a pooled connection (CI saw DECRYPTION_FAILED_OR_BAD_RECORD_MAC once, eight
                # POSTs in flight) is tried again the same way, on a fresh connection.
                for attempt in tenacity.Retrying(
                    retry=tenacity.retry_if_exception_type(
                        (urllib3.exceptions.ProtocolError, urllib3.exceptions.SSLError)
                    ),
                    stop=tenacity.stop_after_attempt(3),
                    reraise=True,
                ):
                    with attempt:
                        try:
                            core.create_node(body)
                        except k8s.ApiException as e:
                            if e.status != 409:
                                raise

            # A few POSTs in flight (the client's pool holds 5 per CPU): thousands of nodes in minutes.
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(create, names))
            wanted = set(names)

            # Only the nodes with these labels, in plain JSON: not the whole fleet's ``V1Node``
            # models twice a second while thousands of nodes come up.
            selector = ",".join(f"{k}={v}" for k, v in (labels or {}).items())

            def ready() -> bool:
                got = core.list_node(label_selector=selector, _preload_content=False)
                listed = json.loads(got.data)["items"]
                schedulable = set()
                for node in listed:
                    conditions = {c["type"]: c["status"] for c in node["status"].get("conditions") or []}
                    taints = {t["key"] for t in node["spec"].get("taints") or []}
                    if conditions.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints:
                        schedulable.add(node["metadata"]["name"])
                return wanted <= schedulable

            timeout = 120 + len(names) / 5  # thousands of nodes take minutes on 2 cores
            wait_until(ready, timeout=timeout, interval=0.5, what=f"KWOK nodes {list(names)[:3]}... Ready")

    def evictions(self) -> list[Eviction]:
        """Every eviction request the API server has answered, in order (its audit log)."""
        path = self.workdir / "audit.log"
        found: list[Eviction] = []
        if not path.exists():
            return found
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            ref = entry.get("objectRef") or {}
            if ref.get("subresource") != "eviction" or entry.get("stage") != "ResponseComplete":
                continue
            found.append(
                Eviction(
                    pod=f"{ref.get('namespace')}/{ref.get('name')}",
                    code=int((entry.get("responseStatus") or {}).get("code") or 0),
                    user=str((entry.get("user") or {}).get("username")),
                    received=dt.datetime.fromisoformat(entry["requestReceivedTimestamp"]).timestamp(),
                )
            )
        return found

    def cordons(self) -> dict[str, float]:
        """node → when the API server completed the first write that set its ``spec.unschedulable``
        to true (unix seconds, microsecond precision; its audit log's ``stageTimestamp``)."""
        path = self.workdir / "audit.log"
        found: dict[str, float] = {}
        if not path.exists():
            return found
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            ref = entry.get("objectRef") or {}
            done = entry.get("stage") == "ResponseComplete"
            ok = (entry.get("responseStatus") or {}).get("code", 200) < 300
            if ref.get("resource") != "nodes" or ref.get("subresource") or not (done and ok):
                continue
            body = entry.get("requestObject") or {}
            if isinstance(body, list):  # a JSON patch (RFC 6902): its operations
                cordoned = any(
                    isinstance(op, dict)
                    and op.get("path") == "/spec/unschedulable"
                    and op.get("value") is True
                    for op in body
                )
            else:
                cordoned = (body.get("spec") or {}).get("unschedulable") is True
            if cordoned and ref.get("name") not in found:
                found[ref["name"]] = dt.datetime.fromisoformat(entry["stageTimestamp"]).timestamp()
        return found

    def eviction_count(self, pod: str) -> int:
        """How many evictions of ``namespace/name`` the API server accepted (201)."""
        return sum(1 for e in self.evictions() if e.pod == pod and e.code == 201)

    def memory_mib(self) -> dict[str, float]:
        """RSS of each component now (MiB)."""
        return {name: rss_mib(p.pid) for name, p in self.processes.items()}

    def log_tail(self, component: str, lines: int = 30) -> str:
        path = self.workdir / f"{component}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _start(cp: ControlPlane, name: str, argv: list[str]) -> None:
    log = (cp.workdir / f"{name}.log").open("wb")
    cp.processes[name] = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
    )
    log.close()


def _alive(cp: ControlPlane, name: str) -> None:
    code = cp.processes[name].poll()
    if code is not None:
        raise RuntimeError(f"{name} exited with {code}:\n{cp.log_tail(name)}")


def _stop(cp: ControlPlane) -> None:
    for name in reversed(COMPONENTS):
        p = cp.processes.get(name)
        if p is not None and p.poll() is None:
            p.terminate()
    for name in reversed(COMPONENTS):
        p = cp.processes.get(name)
        if p is None:
            continue
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=15)


def _component_kubeconfig(cp: ControlPlane, name: str, token: str) -> Path:
    return cp.kubeconfig(token, cp.workdir / f"{name}.kubeconfig")


@contextlib.contextmanager
def control_plane(
    bindir: Path, *, node_grace_seconds: int | None = None, controller_qps: int | None = None
) -> Iterator[ControlPlane]:
    """Start etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK; yield when a
    pod goes Running on a KWOK node (scheduler, controllers and KWOK all work); stop all on exit.

    ``node_grace_seconds``: the node lifecycle controller's ``--node-monitor-grace-period`` (how
    long a node's heartbeat may be late before it is NotReady and its pods not Ready); None = the
    controller's default (50 s). Thousands of KWOK nodes on a loaded machine need more: KWOK renews
    their Leases late, and pods of a NotReady node no longer count for their PodDisruptionBudget.

    ``controller_qps``: kube-controller-manager's ``--kube-api-qps`` (its burst twice that); None =
    its default (20). At the default the node lifecycle controller lifts new nodes' not-ready taint
    at about 10 nodes a second (measured: 1,000 KWOK nodes Ready in 14 s, schedulable in 117 s).
    """
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="healer-kube-"))
    _write_pki(workdir)
    (workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
    tokens = {c: uuid.uuid4().hex for c in ("admin", "controller-manager", "scheduler", "kwok")}
    # Static tokens for the control plane's own clients: token,user,uid,"groups".
    (workdir / "tokens.csv").write_text("".join(f'{t},{c},{c},"system:masters"\n' for c, t in tokens.items()))
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    cp = ControlPlane(
        url=f"https://127.0.0.1:{api_port}",
        ca_file=workdir / "ca.crt",
        admin_token=tokens["admin"],
        workdir=workdir,
    )
    kube = str(bindir / "kube")
    try:
        _start(
            cp,
            "etcd",
            [
                kube,
                "etcd",
                "--name=healer-test",
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=healer-test=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def etcd_healthy() -> bool:
            _alive(cp, "etcd")
            return httpx.get(f"http://127.0.0.1:{etcd_port}/health", timeout=2).json().get("health") == "true"

        wait_until(etcd_healthy, timeout=60, what="etcd healthy")
        _start(
            cp,
            "apiserver",
            [
                kube,
                "apiserver",
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={workdir / 'server.crt'}",
                f"--tls-private-key-file={workdir / 'server.key'}",
                f"--token-auth-file={workdir / 'tokens.csv'}",
                f"--service-account-key-file={workdir / 'sa.pub'}",
                f"--service-account-signing-key-file={workdir / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=Node,RBAC",
                # Pods are created right after their namespace; the "default" ServiceAccount the
                # admission plugin insists on would not exist yet. KWOK runs no containers anyway.
                "--disable-admission-plugins=ServiceAccount",
                # DRA device taints (alpha in 1.34): healer's one-GPU-out creates DeviceTaintRules.
                "--feature-gates=DRADeviceTaints=true",
                "--runtime-config=resource.k8s.io/v1alpha3=true",
                f"--cert-dir={workdir / 'apiserver-certs'}",
                "--profiling=false",
                f"--audit-policy-file={workdir / 'audit-policy.yaml'}",
                f"--audit-log-path={workdir / 'audit.log'}",
                "--audit-log-mode=blocking",
                "--v=1",
            ],
        )
        headers = {"Authorization": f"Bearer {tokens['admin']}"}
        tls = ssl.create_default_context(cafile=str(cp.ca_file))

        def api_ready() -> bool:
            _alive(cp, "apiserver")
            got = httpx.get(f"{cp.url}/readyz", headers=headers, verify=tls, timeout=5)
            return got.status_code == 200

        wait_until(api_ready, timeout=120, interval=0.2, what="kube-apiserver /readyz")
        _start(
            cp,
            "controller-manager",
            [
                kube,
                "controller-manager",
                f"--kubeconfig={_component_kubeconfig(cp, 'controller-manager', tokens['controller-manager'])}",  # noqa: E501
                "--leader-elect=false",
                "--secure-port=0",
                "--use-service-account-credentials=false",
                f"--root-ca-file={cp.ca_file}",
                f"--service-account-private-key-file={workdir / 'sa.key'}",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                *([f"--node-monitor-grace-period={node_grace_seconds}s"] if node_grace_seconds else []),
                *(
                    [f"--kube-api-qps={controller_qps}", f"--kube-api-burst={2 * controller_qps}"]
                    if controller_qps
                    else []
                ),
                "--v=1",
            ],
        )
        _start(
            cp,
            "scheduler",
            [
                kube,
                "scheduler",
                f"--kubeconfig={_component_kubeconfig(cp, 'scheduler', tokens['scheduler'])}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )
        _start(
            cp,
            "kwok",
            [
                str(bindir / "kwok"),
                f"--kubeconfig={_component_kubeconfig(cp, 'kwok', tokens['kwok'])}",
                f"--config={bindir / 'kwok-stages.yaml'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.128.0.0/14",  # pod IPs for thousands of pods (the scale fixture)
            ],
        )
        with cp.admin_client() as api:
            core = k8s.CoreV1Api(api)

            def controllers_up() -> bool:
                for name in ("controller-manager", "scheduler", "kwok"):
                    _alive(cp, name)
                return bool(core.read_namespaced_service_account("default", "default"))

            wait_until(controllers_up, timeout=120, interval=0.2, what="kube-controller-manager running")
            cp.add_nodes(["kube-probe"])
            probe = k8s.V1Pod(
                metadata=k8s.V1ObjectMeta(name="probe"),
                spec=k8s.V1PodSpec(
                    containers=[k8s.V1Container(name="pause", image="registry.k8s.io/pause:3.10")],
                    termination_grace_period_seconds=0,
                ),
            )
            core.create_namespaced_pod("default", probe)

            def probe_running() -> bool:
                for name in ("controller-manager", "scheduler", "kwok"):
                    _alive(cp, name)
                return core.read_namespaced_pod("probe", "default").status.phase == "Running"

            wait_until(probe_running, timeout=120, interval=0.2, what="a pod Running on a KWOK node")
            core.delete_namespaced_pod("probe", "default", grace_period_seconds=0)
            core.delete_node("kube-probe")
        memory = cp.memory_mib()
        REPORT.append(
            f"kubernetes control plane ({bindir.name}) up in {time.monotonic() - started:.1f} s; RSS MiB: "
            + ", ".join(f"{k} {v:.0f}" for k, v in memory.items())
            + f" (total {sum(memory.values()):.0f})"
        )
        yield cp
        memory = cp.memory_mib()
        REPORT.append(
            "kubernetes control plane RSS MiB at the end: "
            + ", ".join(f"{k} {v:.0f}" for k, v in memory.items())
            + f" (total {sum(memory.values()):.0f})"
        )
    except TimeoutError as exc:
        logs = "\n".join(f"--- {name} ---\n{cp.log_tail(name)}" for name in cp.processes)
        raise RuntimeError(f"{exc}; the control plane's logs end with:\n{logs}") from exc
    finally:
        _stop(cp)
        shutil.rmtree(workdir, ignore_errors=True)
