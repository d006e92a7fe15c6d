"""Dry-run with a remediation ladder (real adapter over HTTP to the API emulator, both databases):
healer records the signed repair request it would publish and the escalation, and writes nothing."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.dryrun import RecordingNodeActions
from healer.actions.kubernetes import KubernetesNodeActions
from healer.config import KubernetesSettings, RepairSettings, SafetySettings, Settings
from healer.controller import remediate
from healer.model.findings import TickFindings
from healer.model.states import NodeState
from healer.store.models import Action, Node, Transition
from healer_dev.k8s_emulator import KubernetesEmulator, node
from tests.integration.test_ladder_real_cluster import REPO, RULES, SECRET, SECRET_ENV, T0, xid
from tests.k8s_emulator import emulator, k8s_api, k8s_settings

__all__ = ["emulator", "k8s_api", "k8s_settings"]


def test_dry_run_records_the_repair_it_would_request_and_the_escalation(
    emulator: KubernetesEmulator,
    session_factory: sessionmaker[Session],
    k8s_settings: KubernetesSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET.decode())
    emulator.load([node("gpu-07")])
    settings = Settings(
        kubernetes=k8s_settings,
        safety=SafetySettings(dry_run=True, max_unhealthy=5, max_unhealthy_percent=100),
        repair=RepairSettings(
            actions=["reset-gpu", "reboot"],
            secret_env=SECRET_ENV,
            xid_catalog=REPO / "rules" / "catalog" / "xid-catalog.yaml",
        ),
    )
    api = emulator.api_client()
    real = KubernetesNodeActions(api, k8s_settings, identity="healer-0", clock=lambda: T0)
    actions = RecordingNodeActions(real, session_factory, actor="healer", clock=lambda: T0)
    for at in (T0, T0 + timedelta(minutes=31)):  # no agent answers in dry-run: the step times out
        remediate(
            findings=_tick(at),
            rules=RULES,
            actions=actions,
            session_factory=session_factory,
            settings=settings,
            now=at,
            recovery_hold_seconds=60,
        )
    api.close()
    obj = emulator.get("Node", "gpu-07")
    assert obj is not None and not obj.get("spec", {}).get("unschedulable")
    assert not any(k.endswith("/repair-request") for k in (obj["metadata"].get("annotations") or {}))
    with session_factory() as s:
        rows = s.scalars(select(Action).where(Action.kind == "repair-request")).all()
        reasons = list(s.scalars(select(Transition.reason).order_by(Transition.id)))
        state = s.scalar(select(Node.state).where(Node.name == "gpu-07"))
    assert [r.status for r in rows] == ["dry_run", "dry_run"]
    # What it would have published: the reset, then (no answer within 10 minutes) the reboot.
    annotations = [next(iter(r.detail["annotations"].values())) for r in rows]
    assert '"action":"reset-gpu"' in annotations[0] and '"action":"reboot"' in annotations[1]
    assert any("escalating: reset-gpu (10m) did not clear the finding in time" in r for r in reasons)
    assert state == NodeState.AWAITING_REPAIR


def _tick(at: datetime) -> TickFindings:
    return TickFindings(at=at, firing={"gpu-07": [xid("gpu-07", 48, at=T0)]})
