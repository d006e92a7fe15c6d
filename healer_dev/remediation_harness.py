"""One controller process for tests and benchmarks: the real Kubernetes adapter over HTTP to the
API emulator, a database, settings and a rule set, driven one pass at a time with ``now`` as a
parameter (nothing sleeps); plus the findings they feed it and a counter of the calls a block makes.

Shared by ``tests/integration`` (remediation, ways out, rule pools, errors) and
``bench/controller_calls_bench.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client as k8s
from kubernetes.client import ApiClient
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.kubernetes import STRATEGIC_MERGE, KubernetesNodeActions
from healer.config import KubernetesSettings, SafetySettings, Settings
from healer.controller import RemediationResult, advance_drains, remediate
from healer.model.findings import Finding, TickFindings
from healer.model.states import FindingState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store.models import Action, Node, Transition
from healer_dev.k8s_emulator import KubernetesEmulator, node

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
POOL_LABEL = "node.kubernetes.io/instance-type"
HOLD = 300.0

RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[
                Rule(
                    name="GpuTooHot",
                    expr="max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78",
                    actions=[
                        "quarantine",
                        {"drain": {"timeout": "10m", "delete_emptydir_data": True}},
                        {"ticket": {"provider": "acme"}},
                    ],
                    annotations={"summary": "GPU above 78 C"},
                ),
                Rule(name="EccNotice", expr="y > 0", severity="info", actions=[{"notify": {}}]),
            ],
        ),
    )
)


def hot(name: str, *, fired_at: datetime = T0, rule: str = "GpuTooHot") -> Finding:
    return Finding(
        rule=rule,
        series_key=f'{rule}{{Hostname="{name}",gpu="3"}}',
        node=name,
        gpu="3",
        state=FindingState.FIRING,
        severity="critical",
        value=91.5,
        unit="degrees C",
        labels={"Hostname": name, "gpu": "3"},
        summary="GPU above 78 C",
        active_since=fired_at - timedelta(minutes=5),
        fired_at=fired_at,
    )


def tick(at: datetime, *firing: Finding) -> TickFindings:
    by_node: dict[str, list[Finding]] = {}
    for f in firing:
        by_node.setdefault(f.node, []).append(f)
    return TickFindings(at=at, firing=by_node)


def fleet_nodes(count: int, pool: str = "a100") -> list[dict[str, Any]]:
    return [node(f"gpu-{i:02d}", labels={POOL_LABEL: pool}) for i in range(count)]


class Harness:
    """One controller process: settings, an adapter, the database; ``restart`` builds a new one."""

    def __init__(
        self,
        emu: KubernetesEmulator,
        sessions: sessionmaker[Session],
        k8s_settings: KubernetesSettings,
        *,
        rules: RuleSet = RULES,
        identity: str = "healer-0",
        **safety: Any,
    ) -> None:
        self.emu = emu
        self.sessions = sessions
        self.rules = rules
        limits = {"dry_run": False, "max_unhealthy": 2, "max_unhealthy_percent": 10, **safety}
        self.settings = Settings(kubernetes=k8s_settings, safety=SafetySettings(**limits))
        self.api: ApiClient = emu.api_client()
        self.actions = KubernetesNodeActions(self.api, k8s_settings, identity=identity, clock=lambda: T0)

    def restart(self) -> Harness:
        self.api.close()
        return Harness(
            self.emu,
            self.sessions,
            self.settings.kubernetes,
            rules=self.rules,
            **self.settings.safety.model_dump(),
        )

    def remediate(self, findings: TickFindings, **kw: Any) -> RemediationResult:
        kw.setdefault("recovery_hold_seconds", HOLD)
        # The composition root lists the cluster's nodes (the fleet the breaker's % is taken of).
        kw.setdefault(
            "fleet",
            {
                n["metadata"]["name"]: n["metadata"]["labels"].get(POOL_LABEL, "default")
                for n in self.emu.list("Node")
            },
        )
        return remediate(
            findings=findings,
            rules=kw.pop("rules", self.rules),
            actions=self.actions,
            session_factory=self.sessions,
            settings=self.settings,
            now=findings.at,
            **kw,
        )

    def drains(self, now: datetime, *, rules: RuleSet | None = None) -> RemediationResult:
        return advance_drains(
            rules=rules or self.rules,
            actions=self.actions,
            session_factory=self.sessions,
            settings=self.settings,
            now=now,
        )

    # -- what a user sees --

    def k8s_node(self, name: str) -> dict[str, Any]:
        obj = self.emu.get("Node", name)
        assert obj is not None
        return obj

    def cordoned(self) -> list[str]:
        return sorted(
            n["metadata"]["name"] for n in self.emu.list("Node") if n.get("spec", {}).get("unschedulable")
        )

    def event_reasons(self, name: str) -> list[str]:
        return [
            e.get("reason", "")
            for e in self.emu.list("Event", api_version="events.k8s.io/v1")
            if (e.get("regarding") or {}).get("name") == name
        ]

    def state(self, name: str) -> str:
        with self.sessions() as s:
            return s.scalar(select(Node.state).where(Node.name == name)) or "absent"

    def path(self, name: str) -> list[tuple[str, str]]:
        with self.sessions() as s:
            rows = s.execute(
                select(Transition.from_state, Transition.to_state)
                .join(Node, Node.id == Transition.node_id)
                .where(Node.name == name)
                .order_by(Transition.id)
            ).all()
        return [(a, b) for a, b in rows]

    def actions_of(self, name: str | None = None, **where: Any) -> list[Action]:
        with self.sessions() as s:
            q = select(Action).order_by(Action.id)
            if name is not None:
                q = q.join(Node, Node.id == Action.node_id).where(Node.name == name)
            for key, value in where.items():
                q = q.where(getattr(Action, key) == value)
            return list(s.scalars(q))

    def uncordon_by_hand(self, name: str) -> None:
        k8s.CoreV1Api(self.api).patch_node(
            name, {"spec": {"unschedulable": False}}, _content_type=STRATEGIC_MERGE
        )


@dataclass
class Counts:
    """Calls seen during one measured block: Kubernetes API requests and SQL statements."""

    api: list[tuple[str, str]] = field(default_factory=list)
    sql: list[str] = field(default_factory=list)

    def api_by_method(self) -> str:
        return ", ".join(f"{m} {n}" for m, n in sorted(Counter(m for m, _ in self.api).items()))

    def sql_by_verb(self) -> str:
        verbs = Counter(s.split(None, 1)[0].upper() for s in self.sql)
        return ", ".join(f"{v} {n}" for v, n in sorted(verbs.items()))


@contextmanager
def counting(engine: Engine, emu: KubernetesEmulator) -> Iterator[Counts]:
    """Count the SQL statements ``engine`` runs and the requests ``emu`` serves within the block."""
    counts = Counts()

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        counts.sql.append(statement.strip())

    start = len(emu.requests)
    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        yield counts
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
        counts.api = list(emu.requests)[start:]
