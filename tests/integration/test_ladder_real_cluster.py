"""The remediation ladder on the real control plane (KWOK nodes): the controller as healer's
ServiceAccount (the chart's ClusterRole) publishes signed repair requests on the Node; the node
agent as its own ServiceAccount (the chart's agent RBAC) verifies and carries them out with real
commands; tickets land in the outbox. Findings are given per tick (detection is tested elsewhere)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.kubernetes import KubernetesNodeActions
from healer.actions.validation import ValidationJobs
from healer.config import (
    KubernetesSettings,
    ProviderSettings,
    RepairSettings,
    SafetySettings,
    Settings,
    TicketSettings,
    ValidationSettings,
)
from healer.controller import advance_drains, remediate
from healer.model.findings import Finding, TickFindings
from healer.model.repair import RepairRequest, RepairResult, decode_bundle, request_key, result_key
from healer.model.states import FindingState, NodeState
from healer.nodeagent.agent import NodeAgent
from healer.nodeagent.bundle import Capture, bundle_reason
from healer.nodeagent.executor import CommandExecutor
from healer.nodeagent.kmsg import KmsgFile
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store.models import Node, Ticket, Transition
from healer.tickets import payloads
from healer.tickets.delivery import deliver_due
from healer_dev.agent_fixture import AgentFixture
from healer_dev.provider import Receiver
from tests.helm import NAMESPACE, rendered_objects, require_helm
from tests.integration.test_api_support import VIEWER_TOKEN, build_app, http_client, make_settings
from tests.kube_cluster import ControlPlane
from tests.services import wait_until

REPO = Path(__file__).resolve().parents[2]
DOMAIN = "healer.dev"
SECRET = b"test-repair-signing-key-0123456789"
SECRET_ENV = "HEALER_TEST_REPAIR_SECRET"
K8S = KubernetesSettings(domain=DOMAIN, namespace=NAMESPACE, request_timeout_seconds=10)
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOLD = 60.0
RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu-errors",
            rules=[
                Rule(
                    name="GpuFatalXidRecent",
                    expr='max by (Hostname, gpu, UUID, xid) (DCGM_EXP_XID_ERRORS_COUNT{xid=~"48|79"}) > 0',
                    classify="xid-label",
                    actions=["quarantine", {"ticket": {"provider": "acme"}}],
                ),
            ],
        ),
    )
)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def agent_token(kube: ControlPlane) -> str:
    """A token of ServiceAccount healer-agent, bound by the chart's agent RBAC (agent.enabled)."""
    objects = [
        o
        for o in rendered_objects(require_helm(), "--set", "agent.enabled=true")
        if o["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
        and o["metadata"]["name"] == "healer-agent"
    ]
    assert len(objects) == 3
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    kube.apply([namespace, *objects])
    return kube.service_account_token(NAMESPACE, "healer-agent")


@pytest.fixture
def agent_api(kube: ControlPlane, agent_token: str) -> Iterator[ApiClient]:
    with kube.client(agent_token) as api:
        yield api


@pytest.fixture
def admin(kube_admin: ApiClient) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_admin)


def make_agent(
    api: ApiClient,
    node: str,
    log: Path,
    *,
    exit_code: int = 0,
    now: datetime | None = None,
    kmsg: Path | None = None,
) -> NodeAgent:
    """The agent of ``node``; its commands append to ``log`` and exit with ``exit_code``; its clock
    reads ``now`` (the test's tick time) when given; before a reboot it captures a log bundle from
    the kernel log ``kmsg`` (a file of /dev/kmsg records) and a stand-in ``nvidia-smi -q``."""
    commands = {
        "reset-gpu": ["sh", "-c", f"echo reset {{gpu}} >> {log}; exit {exit_code}"],
        "reboot": ["sh", "-c", f"echo reboot >> {log}; exit {exit_code}"],
    }
    agent = NodeAgent(
        k8s.CoreV1Api(api), node=node, domain=DOMAIN, secret=SECRET, executor=CommandExecutor(commands)
    )
    if now is not None:
        agent.clock = lambda: now
    if kmsg is not None:
        smi = ["sh", "-c", "echo '==============NVSMI LOG=============='; echo 'Driver Version : 570.133.20'"]
        agent.bundler = lambda r: Capture(
            node=node,
            why=bundle_reason(r),
            kmsg=KmsgFile(kmsg),
            nvidia_smi=smi,
            at="t",
        ).encoded()
    return agent


def request(node: str, *, nonce: str = "7-0-1", expires: datetime | None = None) -> RepairRequest:
    at = expires or datetime.now(UTC) + timedelta(minutes=10)
    return RepairRequest(
        node=node, action="reset-gpu", gpu="3", incident=7, nonce=nonce, expires=at.isoformat()
    )


def put(admin: k8s.CoreV1Api, node: str, value: str) -> None:
    admin.patch_node(node, {"metadata": {"annotations": {request_key(DOMAIN): value}}})


def answer(admin: k8s.CoreV1Api, node: str) -> RepairResult | None:
    annotations = admin.read_node(node).metadata.annotations or {}
    return RepairResult.parse(annotations.get(result_key(DOMAIN)))


def test_agent_refuses_unsigned_forged_other_node_expired_and_replayed_requests(
    kube: ControlPlane, admin: k8s.CoreV1Api, agent_api: ApiClient, tmp_path: Path
) -> None:
    a, b = unique("agent-a"), unique("agent-b")
    kube.add_nodes([a, b])
    log = tmp_path / "commands.log"
    agent = make_agent(agent_api, a, log)
    unsigned = request(a)
    cases = [
        (
            '{"node": "' + a + '", "action": "reset-gpu", "gpu": "3", "incident": 7, "nonce": "n1"}',
            "unsigned",
        ),
        (request(a, nonce="n2").signed(b"not-the-controller"), "bad signature"),
        (request(b, nonce="n3").signed(SECRET), f"addressed to node {b!r}"),
        (request(a, nonce="n4", expires=datetime.now(UTC) - timedelta(seconds=1)).signed(SECRET), "expired"),
        ("not json", "not JSON"),
    ]
    for raw, reason in cases:
        put(admin, a, raw)
        result = agent.once()
        assert result is not None and result.status == "refused", raw
        assert reason in result.reason
        seen = answer(admin, a)
        assert seen is not None and seen.status == "refused" and reason in seen.reason
    assert not log.exists()  # nothing was carried out

    put(admin, a, unsigned.signed(SECRET))
    result = agent.once()
    assert result is not None and result.status == "succeeded"
    assert log.read_text() == "reset 3\n"
    # The same request again, to a restarted agent: already answered, not run twice.
    put(admin, a, unsigned.signed(SECRET) + " ")
    again = make_agent(agent_api, a, log).once()
    assert again is None or again.status == "refused"
    assert log.read_text() == "reset 3\n"
    # Node b never heard of any of it.
    assert answer(admin, b) is None


class Ladder:
    """The controller (healer's ServiceAccount, real adapter) and one agent per node."""

    def __init__(
        self,
        api: ApiClient,
        agent_api: ApiClient,
        sessions: sessionmaker[Session],
        tmp: Path,
        validator: ValidationJobs | None = None,
        *,
        rules: RuleSet = RULES,
        tickets: TicketSettings | None = None,
    ) -> None:
        self.validator = validator
        self.rules = rules
        self.sessions = sessions
        self.agent_api = agent_api
        self.tmp = tmp
        self.settings = Settings(
            kubernetes=K8S,
            safety=SafetySettings(dry_run=False, max_unhealthy=5, max_unhealthy_percent=100),
            repair=RepairSettings(
                actions=["reset-gpu", "reboot"],
                secret_env=SECRET_ENV,
                xid_catalog=REPO / "rules" / "catalog" / "xid-catalog.yaml",
            ),
            tickets=tickets or TicketSettings(),
        )
        self.actions = KubernetesNodeActions(api, K8S, identity="healer-0", clock=lambda: T0)
        self.now = T0

    def tick(self, at: datetime, *firing: Finding) -> None:
        self.now = at
        by_node: dict[str, list[Finding]] = {}
        for f in firing:
            by_node.setdefault(f.node, []).append(f)
        remediate(
            findings=TickFindings(at=at, firing=by_node),
            rules=self.rules,
            actions=self.actions,
            session_factory=self.sessions,
            settings=self.settings,
            now=at,
            recovery_hold_seconds=HOLD,
            validator=self.validator,
        )

    def drains(self, at: datetime) -> None:
        """The drain pass at ``at``."""
        self.now = at
        advance_drains(
            rules=self.rules,
            actions=self.actions,
            session_factory=self.sessions,
            settings=self.settings,
            now=at,
        )

    def deliver(self, at: datetime) -> list[str]:
        """The ticket outbox's delivery job at ``at``: what it did with each message due."""
        with httpx.Client() as client:
            report = deliver_due(
                session_factory=self.sessions,
                settings=self.settings,
                now=at,
                client=client,
                rng=random.Random(1),
            )
        return [o.result for o in report.outcomes]

    def agent(self, node: str, *, exit_code: int = 0, kmsg: Path | None = None) -> RepairResult | None:
        log = self.tmp / f"{node}.log"
        at = self.now + timedelta(seconds=5)
        return make_agent(self.agent_api, node, log, exit_code=exit_code, now=at, kmsg=kmsg).once()

    def ticket_context(self, node: str) -> dict[str, Any]:
        """What the provider's ticket for ``node`` is rendered from (at delivery)."""
        with self.sessions() as s:
            query = select(Ticket).join(Node, Node.id == Ticket.node_id).where(Node.name == node)
            ticket = s.scalars(query).one()
            return payloads.build_context(
                s,
                ticket=ticket,
                cluster="test",
                dashboard_url="http://healer.test",
                idempotency_key="k",
                escalation={},
            )

    def commands(self, node: str) -> list[str]:
        path = self.tmp / f"{node}.log"
        return path.read_text().splitlines() if path.exists() else []

    def state(self, node: str) -> str:
        with self.sessions() as s:
            return s.scalar(select(Node.state).where(Node.name == node)) or "absent"

    def reasons(self, node: str) -> list[str]:
        with self.sessions() as s:
            rows = s.scalars(
                select(Transition.reason)
                .join(Node, Node.id == Transition.node_id)
                .where(Node.name == node)
                .order_by(Transition.id)
            )
            return list(rows)

    def tickets(self) -> list[tuple[str, str]]:
        with self.sessions() as s:
            rows = s.execute(select(Node.name, Ticket.provider).join(Node, Node.id == Ticket.node_id)).all()
            return [(a, b) for a, b in rows]


@pytest.fixture
def ladder(
    kube_healer_api: ApiClient,
    agent_api: ApiClient,
    session_factory: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Ladder:
    monkeypatch.setenv(SECRET_ENV, SECRET.decode())
    return Ladder(kube_healer_api, agent_api, session_factory, tmp_path)


def firing(
    node: str, rule: str, *, gpu: str, labels: dict[str, str], unit: str, summary: str, at: datetime = T0
) -> Finding:
    """``rule``'s finding firing since ``at`` on GPU ``gpu`` of ``node`` (its series ``labels``)."""
    labels = {"Hostname": node, "gpu": gpu, **labels}
    key = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return Finding(
        rule=rule,
        series_key=f"{rule}{{{key}}}",
        node=node,
        gpu=gpu,
        state=FindingState.FIRING,
        severity="critical",
        value=1.0,
        unit=unit,
        labels=labels,
        summary=summary,
        active_since=at,
        fired_at=at,
    )


def xid(node: str, code: int, *, uuid: str = "GPU-1111", at: datetime = T0) -> Finding:
    return firing(
        node,
        "GpuFatalXidRecent",
        gpu="3",
        labels={"UUID": uuid, "xid": str(code)},
        unit="Xids in the exporter's window",
        summary=f"GPU 3 reported Xid {code}",
        at=at,
    )


def node_obj(admin: k8s.CoreV1Api, name: str) -> Any:
    return admin.read_node(name)


def requested(admin: k8s.CoreV1Api, name: str) -> str:
    """The request healer published on Node ``name`` (signed JSON)."""
    return str((node_obj(admin, name).metadata.annotations or {})[request_key(DOMAIN)])


def kernel_log(root: Path, gpu: int, code: int, text: str, *, usec: int) -> Path:
    """A node's kernel log (a file of /dev/kmsg records) under ``root``, with one Xid line."""
    node = AgentFixture(root)
    node.root.mkdir()
    node.log_xid(gpu, code, text, usec=usec)
    return node.kmsg


def test_reset_class_xid_is_reset_by_the_agent_and_returns_after_validation_without_a_ticket(
    kube: ControlPlane, admin: k8s.CoreV1Api, ladder: Ladder
) -> None:
    name = unique("ladder-reset")
    kube.add_nodes([name])
    ladder.tick(T0, xid(name, 48))
    assert ladder.state(name) == NodeState.AWAITING_REPAIR
    node = node_obj(admin, name)
    assert node.spec.unschedulable is True
    raw = (node.metadata.annotations or {})[request_key(DOMAIN)]
    assert '"action":"reset-gpu"' in raw and '"gpu":"3"' in raw and '"signature":' in raw

    result = ladder.agent(name)
    assert result is not None and result.status == "succeeded"
    assert ladder.commands(name) == ["reset 3"]
    # The reset cleared the Xid: validation, then the recovery hold, then back in service.
    ladder.tick(T0 + timedelta(minutes=1))
    assert ladder.state(name) == NodeState.VALIDATING
    ladder.tick(T0 + timedelta(minutes=1, seconds=HOLD + 1))
    assert ladder.state(name) == NodeState.HEALTHY
    assert node_obj(admin, name).spec.unschedulable in (None, False)
    assert ladder.tickets() == []
    assert any("reset-gpu done by the node agent" in r for r in ladder.reasons(name))


def test_a_reset_that_does_not_clear_escalates_to_reboot_then_ticket(
    kube: ControlPlane, admin: k8s.CoreV1Api, ladder: Ladder
) -> None:
    name = unique("ladder-esc")
    kube.add_nodes([name])
    ladder.tick(T0, xid(name, 48))
    assert ladder.agent(name) is not None
    # The Xid comes back after the reset: validation fails, the ladder's next step is a reboot.
    t1 = T0 + timedelta(minutes=2)
    ladder.tick(t1, xid(name, 48, at=t1))
    assert ladder.state(name) == NodeState.AWAITING_REPAIR
    raw = requested(admin, name)
    assert '"action":"reboot"' in raw
    # Before rebooting, the agent keeps the node's logs: the reboot would wipe them.
    dbe = "An uncorrectable double bit error (DBE) has been detected"
    result = ladder.agent(name, kmsg=kernel_log(ladder.tmp / "node", 3, 48, dbe, usec=7_000_000))
    assert result is not None and result.status == "succeeded" and result.reason == "reboot started"
    assert result.bundle
    assert ladder.commands(name) == ["reset 3", "reboot"]
    t2 = T0 + timedelta(minutes=10)
    ladder.tick(t2, xid(name, 48, at=t2))
    assert ladder.state(name) == NodeState.AWAITING_REPAIR
    assert ladder.tickets() == [(name, "acme")]
    # The replacement ticket carries what the agent captured before the reboot.
    bundle = ladder.ticket_context(name)["log_bundle"]
    assert bundle["action"] == "reboot"
    assert f"healer log bundle: node {name}, captured t before reboot for incident " in bundle["text"]
    assert (
        "NVRM: Xid (PCI:0000:5d:00): 48, An uncorrectable double bit error (DBE) has been detected"
        in (bundle["text"].split("=== NVIDIA driver Xid lines (1) ===")[1])
    )
    assert "Driver Version : 570.133.20" in bundle["text"]
    assert any("escalating: reset-gpu did not clear it" in r for r in ladder.reasons(name))
    assert any("escalating: reboot did not clear it" in r for r in ladder.reasons(name))


def test_an_agent_that_fails_the_reset_escalates_at_once(
    kube: ControlPlane, admin: k8s.CoreV1Api, ladder: Ladder
) -> None:
    name = unique("ladder-fail")
    kube.add_nodes([name])
    ladder.tick(T0, xid(name, 48))
    result = ladder.agent(name, exit_code=3)
    assert result is not None and result.status == "failed" and "exit 3" in result.output
    ladder.tick(T0 + timedelta(minutes=1), xid(name, 48))
    raw = requested(admin, name)
    assert '"action":"reboot"' in raw


def test_a_ladder_that_fails_fast_sends_its_ticket_with_the_repairs_bundle_without_waiting(
    kube: ControlPlane,
    admin: k8s.CoreV1Api,
    agent_api: ApiClient,
    kube_healer_api: ApiClient,
    session_factory: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: Receiver,
) -> None:
    """The reset asked as the node is held replaces the capture asked at quarantine on the Node
    (the agent holds one request at a time). The reset fails and the reboot does not clear the
    Xid, all within seconds: the replacement ticket goes at once, with the bundle the agent
    captured before the reboot, instead of waiting out the capture's 60 s for an answer that
    cannot come."""
    tickets = acme_tickets(provider, monkeypatch)
    ladder = Ladder(kube_healer_api, agent_api, session_factory, tmp_path, tickets=tickets)
    name = unique("ladder-fast")
    kube.add_nodes([name])
    ladder.tick(T0, xid(name, 48))
    assert '"action":"reset-gpu"' in requested(admin, name)  # the capture's request replaced
    assert ladder.agent(name, exit_code=3) is not None
    ladder.tick(T0 + timedelta(seconds=10), xid(name, 48))
    assert '"action":"reboot"' in requested(admin, name)
    kmsg = kernel_log(ladder.tmp / "node", 3, 48, "DBE", usec=7_000_000)
    result = ladder.agent(name, kmsg=kmsg)
    assert result is not None and result.reason == "reboot started" and result.bundle
    # The node is back with the Xid again: the reboot did not clear it, the ticket is asked.
    for seconds in (20, 25):
        ladder.tick(T0 + timedelta(seconds=seconds), xid(name, 48, at=T0 + timedelta(seconds=seconds)))
    assert ladder.tickets() == [(name, "acme")]
    assert ladder.deliver(T0 + timedelta(seconds=26)) == ["delivered"]
    (received,) = provider.requests
    assert received.json["log_bundle"]["action"] == "reboot"
    assert received.json["log_bundle_note"] is None
    assert ladder.commands(name) == ["reset 3", "reboot"]


def test_a_gpu_that_failed_on_node_a_goes_straight_to_replacement_on_node_b(
    kube: ControlPlane, admin: k8s.CoreV1Api, ladder: Ladder
) -> None:
    a, b = unique("ladder-a"), unique("ladder-b")
    kube.add_nodes([a, b])
    ladder.tick(T0, xid(a, 48, uuid="GPU-moved"))
    assert ladder.agent(a) is not None
    ladder.tick(T0 + timedelta(minutes=1))
    ladder.tick(T0 + timedelta(minutes=1, seconds=HOLD + 1))
    assert ladder.state(a) == NodeState.HEALTHY
    # The GPU was moved to node b and fails there with another reset-class Xid.
    t = T0 + timedelta(hours=2)
    ladder.tick(t, xid(b, 48, uuid="GPU-moved", at=t))
    assert ladder.state(b) == NodeState.AWAITING_REPAIR
    assert ladder.tickets() == [(b, "acme")]
    # No repair asked of b's agent: only the log capture for the ticket, as it was quarantined.
    raw = requested(admin, b)
    assert '"action":"capture"' in raw
    assert any("GPU-moved failed before after a repair" in r for r in ladder.reasons(b))
    with ladder.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Ticket)) == 1
    # The parts ledger flags it, with both nodes, and counts the reset that worked on node a.
    viewer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    app = build_app(ladder.sessions, make_settings(), clock=lambda: t + timedelta(minutes=5))
    with http_client(app) as client:
        got = client.get("/api/v1/parts", params={"repeat": "true"}, headers=viewer)
        assert got.status_code == 200, got.text
        body = got.json()
        metrics = client.get("/metrics").text
    (part,) = body["parts"]
    assert part["id"] == "GPU-moved" and part["repeat"] is True and part["nodes"] == sorted([a, b])
    assert part["mean_time_between_failures_seconds"] == pytest.approx(7200.0)
    steps = {(x["step"], x["provider"]): (x["attempts"], x["succeeded"]) for x in body["steps"]}
    assert steps[("reset-gpu", "node-agent")] == (1, 1)
    assert steps[("ticket", "acme")] == (1, 0)
    assert 'healer_repeat_parts{kind="gpu"} 1.0' in metrics
    assert 'healer_repair_success_ratio{provider="node-agent",step="reset-gpu"} 1.0' in metrics


# --- the validation Job before return ---------------------------------------------------------------

VALIDATION = ValidationSettings(enabled=True, namespace=NAMESPACE, image="registry.example.com/dcgm:test")


@pytest.fixture
def validating(
    kube: ControlPlane,
    kube_admin: ApiClient,
    kube_healer_api: ApiClient,
    agent_api: ApiClient,
    session_factory: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Ladder]:
    """The ladder with validation Jobs, healer holding the chart's validation Role (removed after)."""
    objects = [
        o
        for o in rendered_objects(require_helm(), "--set", "settings.validation.enabled=true")
        if o["metadata"]["name"] == "healer-validation"
    ]
    assert {o["kind"] for o in objects} == {"Role", "RoleBinding"}
    kube.apply(objects)
    monkeypatch.setenv(SECRET_ENV, SECRET.decode())
    validator = ValidationJobs(kube_healer_api, VALIDATION, K8S)
    yield Ladder(kube_healer_api, agent_api, session_factory, tmp_path, validator=validator)
    rbac = k8s.RbacAuthorizationV1Api(kube_admin)
    rbac.delete_namespaced_role_binding("healer-validation", NAMESPACE)
    rbac.delete_namespaced_role("healer-validation", NAMESPACE)


def job_pod(admin: k8s.CoreV1Api, node: str) -> Any:
    """The validation pod on ``node`` once KWOK has completed it (KWOK ends Job pods with exit 0
    and no termination message)."""
    found: list[Any] = []

    def done() -> bool:
        pods = admin.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}").items
        found[:] = [p for p in pods if p.status.phase in ("Succeeded", "Failed")]
        return bool(found)

    wait_until(done, timeout=60, interval=0.2, what=f"validation pod on {node} completed")
    return found[0]


def finish(admin: k8s.CoreV1Api, pod: Any, *, exit_code: int, message: str) -> None:
    """As the validation container would end: its exit code and its termination message."""
    status = pod.status.container_statuses[0]
    terminated = {
        "exitCode": exit_code,
        "message": message,
        "reason": "Completed" if exit_code == 0 else "Error",
    }
    terminated["startedAt"] = status.state.terminated.started_at.isoformat()
    terminated["finishedAt"] = status.state.terminated.finished_at.isoformat()
    body = {
        "status": {
            "containerStatuses": [
                {
                    "name": status.name,
                    "image": status.image,
                    "ready": False,
                    "restartCount": 0,
                    "imageID": "",
                    "state": {"terminated": terminated},
                }
            ]
        }
    }
    admin.patch_namespaced_pod_status(pod.metadata.name, NAMESPACE, body)


def repaired_and_validating(kube: ControlPlane, admin: k8s.CoreV1Api, ladder: Ladder, name: str) -> Any:
    kube.add_nodes([name])
    ladder.tick(T0, xid(name, 48))
    assert ladder.agent(name) is not None
    ladder.tick(T0 + timedelta(minutes=1))  # reset done → repaired → validating, the Job starts
    assert ladder.state(name) == NodeState.VALIDATING
    jobs = k8s.BatchV1Api(admin.api_client).list_namespaced_job(NAMESPACE).items
    (job,) = [j for j in jobs if j.spec.template.spec.node_name == name]
    spec = job.spec.template.spec
    assert {"key": f"{DOMAIN}/quarantined", "operator": "Exists"} in [
        {"key": t.key, "operator": t.operator} for t in spec.tolerations
    ]
    assert spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}
    assert spec.containers[0].termination_message_policy == "FallbackToLogsOnError"
    return job_pod(admin, name)


def test_a_passing_validation_job_gates_the_return_and_is_cleaned_up(
    kube: ControlPlane, admin: k8s.CoreV1Api, validating: Ladder
) -> None:
    name = unique("val-pass")
    pod = repaired_and_validating(kube, admin, validating, name)
    finish(admin, pod, exit_code=0, message='dcgmi ok\n{"dcgm_level": 2, "passed": true}')
    validating.tick(T0 + timedelta(minutes=2))  # the Job passed (recorded, cleaned up); hold starts
    assert validating.state(name) == NodeState.VALIDATING
    validating.tick(T0 + timedelta(minutes=2, seconds=HOLD))
    if validating.state(name) != NodeState.HEALTHY:
        # The release's write can meet a 409 (the Node changed under it: KWOK's status updates;
        # CI saw it once): healer re-reads the node and tries again on the next pass.
        validating.tick(T0 + timedelta(minutes=2, seconds=HOLD + 1))
    assert validating.state(name) == NodeState.HEALTHY
    assert any("validation Job healer-validate-" in r and "passed" in r for r in validating.reasons(name))
    assert validating.tickets() == []
    with validating.sessions() as s:
        evidence = s.scalars(
            select(Transition.evidence)
            .join(Node, Node.id == Transition.node_id)
            .where(Node.name == name, Transition.reason.contains("passed"))
        ).all()
    assert evidence and evidence[0]["validation"]["result"] == {"dcgm_level": 2, "passed": True}
    batch = k8s.BatchV1Api(admin.api_client)
    assert [
        j for j in batch.list_namespaced_job(NAMESPACE).items if j.spec.template.spec.node_name == name
    ] == []


def test_a_failed_validation_job_reopens_the_incident_with_its_evidence(
    kube: ControlPlane, admin: k8s.CoreV1Api, validating: Ladder
) -> None:
    name = unique("val-fail")
    pod = repaired_and_validating(kube, admin, validating, name)
    finish(admin, pod, exit_code=1, message='{"dcgm_level": 2, "passed": false, "failed_test": "memtest"}')
    validating.tick(T0 + timedelta(minutes=2))
    assert validating.state(name) == NodeState.AWAITING_REPAIR
    assert node_obj(admin, name).spec.unschedulable is True
    assert validating.tickets() == [(name, "acme")]
    assert any("failed (exit code 1): re-opened" in r for r in validating.reasons(name))
    with validating.sessions() as s:
        from healer.store.models import Incident

        incidents = s.scalars(
            select(Incident)
            .join(Node, Node.id == Incident.node_id)
            .where(Node.name == name)
            .order_by(Incident.id)
        ).all()
        assert [i.close_reason for i in incidents] == ["failed validation Job after repair", None]
        evidence = s.scalars(
            select(Transition.evidence).where(Transition.incident_id == incidents[1].id)
        ).all()
    assert any(
        (e or {}).get("validation", {}).get("result", {}).get("failed_test") == "memtest" for e in evidence
    )


# --- the log bundle captured at quarantine, for a ticket no reboot precedes --------------------------

PROVIDER_SECRET = "acme-webhook-secret-0123456789"
PROVIDER_SECRET_ENV = "HEALER_TEST_ACME_SECRET"
#: A rule with no ladder: quarantine, drain, then the replacement ticket (no reboot before it).
ROW_REMAP = RuleSet(
    groups=(
        RuleGroup(
            name="gpu-memory",
            rules=[
                Rule(
                    name="GpuRowRemapFailed",
                    expr="DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
                    actions=["quarantine", "drain", {"ticket": {"provider": "acme"}}],
                ),
            ],
        ),
    )
)


def row_remap(node: str) -> Finding:
    return firing(
        node,
        "GpuRowRemapFailed",
        gpu="2",
        labels={"UUID": "GPU-2222"},
        unit="rows",
        summary="GPU 2 failed to remap a row",
    )


@pytest.fixture
def provider() -> Iterator[Receiver]:
    with Receiver(secret=PROVIDER_SECRET.encode()) as rcv:
        yield rcv


def acme_tickets(provider: Receiver, monkeypatch: pytest.MonkeyPatch) -> TicketSettings:
    """The provider ``acme`` at the stand-in receiver, and the repair and webhook secrets set."""
    monkeypatch.setenv(SECRET_ENV, SECRET.decode())
    monkeypatch.setenv(PROVIDER_SECRET_ENV, PROVIDER_SECRET)
    return TicketSettings(
        cluster_name="test",
        dashboard_url="http://healer.test",
        providers=[
            ProviderSettings(name="acme", url=f"{provider.url}/intake", secret_env=PROVIDER_SECRET_ENV)
        ],
    )


@pytest.fixture
def capturing(
    kube_healer_api: ApiClient,
    agent_api: ApiClient,
    session_factory: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: Receiver,
) -> Ladder:
    """The controller with a node agent configured (repair.actions) and the provider ``acme`` at
    the stand-in receiver; the rule quarantines, drains and asks for its ticket."""
    tickets = acme_tickets(provider, monkeypatch)
    return Ladder(kube_healer_api, agent_api, session_factory, tmp_path, rules=ROW_REMAP, tickets=tickets)


def test_the_agent_answers_a_capture_with_the_bundle_and_runs_nothing(
    kube: ControlPlane, admin: k8s.CoreV1Api, agent_api: ApiClient, tmp_path: Path
) -> None:
    name = unique("agent-capture")
    kube.add_nodes([name])
    kmsg = kernel_log(tmp_path / "node", 2, 94, "Contained ECC error", usec=5_000_000)
    log = tmp_path / "commands.log"
    agent = make_agent(agent_api, name, log, kmsg=kmsg)
    at = (datetime.now(UTC) + timedelta(minutes=10)).isoformat()
    put(admin, name, RepairRequest(name, "capture", None, 9, "9-capture-1", at).signed(SECRET))
    result = agent.once()
    assert result is not None and result.status == "succeeded" and result.reason == "log bundle captured"
    seen = answer(admin, name)
    assert seen is not None and seen.nonce == "9-capture-1" and seen.bundle == result.bundle
    text = decode_bundle(seen.bundle)
    assert f"healer log bundle: node {name}, captured t before the ticket for incident 9" in text
    assert "NVRM: Xid (PCI:" in text and "): 94, Contained ECC error" in text
    assert "Driver Version : 570.133.20" in text
    assert not log.exists()  # no command: nothing on the node changed


def test_a_gpu_reset_is_answered_with_the_bundle_captured_before_it(
    kube: ControlPlane, admin: k8s.CoreV1Api, agent_api: ApiClient, tmp_path: Path
) -> None:
    """The reset's request can replace the quarantine's capture request on the Node before the
    agent read it: the reset's own answer carries the logs from before the reset."""
    name = unique("agent-reset")
    kube.add_nodes([name])
    kmsg = kernel_log(tmp_path / "node", 2, 94, "Contained ECC error", usec=5_000_000)
    log = tmp_path / "commands.log"
    agent = make_agent(agent_api, name, log, kmsg=kmsg)
    put(admin, name, request(name, nonce="7-0-9").signed(SECRET))
    result = agent.once()
    assert result is not None and result.status == "succeeded" and result.reason == "reset-gpu done"
    assert log.read_text() == "reset 3\n"
    seen = answer(admin, name)
    assert seen is not None and seen.nonce == "7-0-9" and seen.bundle == result.bundle
    text = decode_bundle(seen.bundle)
    assert f"healer log bundle: node {name}, captured t before reset-gpu for incident 7" in text
    assert "): 94, Contained ECC error" in text


def test_a_replacement_ticket_without_a_reboot_carries_the_bundle_captured_at_quarantine(
    kube: ControlPlane, admin: k8s.CoreV1Api, capturing: Ladder, provider: Receiver
) -> None:
    name = unique("capture")
    kube.add_nodes([name])
    capturing.tick(T0, row_remap(name))  # quarantined (the capture asked), draining
    assert capturing.state(name) == NodeState.DRAINING
    raw = requested(admin, name)
    assert '"action":"capture"' in raw
    kmsg = kernel_log(capturing.tmp / "node", 2, 63, "Row remapping failed", usec=9_000_000)
    result = capturing.agent(name, kmsg=kmsg)
    assert result is not None and result.status == "succeeded" and result.bundle
    # The drain finishes before the next tick has read the answer: the ticket waits for it.
    capturing.drains(T0 + timedelta(seconds=10))
    assert capturing.state(name) == NodeState.AWAITING_REPAIR
    assert capturing.tickets() == [(name, "acme")]
    assert capturing.deliver(T0 + timedelta(seconds=11)) == []
    # The next tick records the answer, with its bundle, and the ticket goes at once.
    capturing.tick(T0 + timedelta(seconds=20), row_remap(name))
    assert "log bundle captured by the node agent for the ticket" in capturing.reasons(name)
    assert capturing.deliver(T0 + timedelta(seconds=21)) == ["delivered"]
    (received,) = provider.requests
    payload = received.json
    assert received.signature == "ok"
    assert payload["log_bundle"]["action"] == "capture"
    assert payload["log_bundle_note"] is None
    text = payload["log_bundle"]["text"]
    assert f"healer log bundle: node {name}, captured t before the ticket for incident " in text
    assert "NVRM: Xid (PCI:" in text and "): 63, Row remapping failed" in text
    assert "Driver Version : 570.133.20" in text
    assert capturing.commands(name) == []  # the agent ran nothing


def test_a_ticket_whose_capture_is_never_answered_goes_after_the_wait_without_a_bundle(
    kube: ControlPlane, admin: k8s.CoreV1Api, capturing: Ladder, provider: Receiver
) -> None:
    name = unique("capture-late")
    kube.add_nodes([name])
    capturing.tick(T0, row_remap(name))
    capturing.drains(T0 + timedelta(seconds=10))
    assert capturing.tickets() == [(name, "acme")]
    # No agent answers: held until the wait (60 s from the request) is over, then sent as is.
    assert capturing.deliver(T0 + timedelta(seconds=59)) == []
    capturing.tick(T0 + timedelta(seconds=30), row_remap(name))
    assert capturing.deliver(T0 + timedelta(seconds=60)) == ["delivered"]
    (received,) = provider.requests
    payload = received.json
    assert payload["log_bundle"] is None
    assert payload["log_bundle_note"] == (
        f"the node agent did not answer the log capture asked at {T0.isoformat()}"
    )
