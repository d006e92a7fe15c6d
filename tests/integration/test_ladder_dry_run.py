"""Dry-run with a remediation ladder (real adapter over HTTP to the API emulator, both databases):
healer records the signed repair request it would publish and the escalation, and writes nothing."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.dryrun import RecordingNodeActions
from healer.actions.kubernetes import KubernetesNodeActions
from healer.actions.validation import ValidationJobs
from healer.actions.validation_dryrun import RecordedValidationJobs
from healer.config import KubernetesSettings, RepairSettings, SafetySettings, Settings, ValidationSettings
from healer.controller import remediate
from healer.model.findings import TickFindings
from healer.model.states import NodeState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store.models import Action, Node, Transition
from healer.wiring import validation_jobs
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


QUARANTINE_ONLY = RuleSet(
    groups=(
        RuleGroup(
            name="gpu-errors",
            rules=[
                Rule(name="GpuFatalXidRecent", expr="DCGM_EXP_XID_ERRORS_COUNT > 0", actions=["quarantine"])
            ],
        ),
    )
)


def test_dry_run_records_the_validation_job_it_would_create(
    emulator: KubernetesEmulator,
    session_factory: sessionmaker[Session],
    k8s_settings: KubernetesSettings,
) -> None:
    """With validation Jobs on, a dry-run return to service records the Job (its whole manifest:
    pinned to the node, all its GPUs, healer's taint tolerated) and its clean-up, and creates none."""
    emulator.load([node("gpu-07", gpus=4)])
    settings = Settings(
        kubernetes=k8s_settings,
        safety=SafetySettings(dry_run=True, max_unhealthy=5, max_unhealthy_percent=100),
        validation=ValidationSettings(
            enabled=True, namespace="healer-system", image="registry.example.com/dcgm:1"
        ),
    )
    api = emulator.api_client()
    real = KubernetesNodeActions(api, k8s_settings, identity="healer-0", clock=lambda: T0)
    actions = RecordingNodeActions(real, session_factory, actor="healer", clock=lambda: T0)
    validator = validation_jobs(settings, api, actions)
    assert isinstance(validator, RecordedValidationJobs)
    states = []
    for at, firing in (
        (T0, True),  # quarantined
        (T0 + timedelta(minutes=5), False),  # clear: validating, the Job would start
        (T0 + timedelta(minutes=6), False),  # the Job "passed" (dry-run), the hold starts
        (T0 + timedelta(minutes=8), False),  # the hold is over: back in service
    ):
        remediate(
            findings=TickFindings(at=at, firing={"gpu-07": [xid("gpu-07", 48, at=T0)]} if firing else {}),
            rules=QUARANTINE_ONLY,
            actions=actions,
            session_factory=session_factory,
            settings=settings,
            now=at,
            recovery_hold_seconds=60,
            validator=validator,
        )
        with session_factory() as s:
            states.append(s.scalar(select(Node.state).where(Node.name == "gpu-07")))
    api.close()
    assert states[-1] == NodeState.HEALTHY, states
    with session_factory() as s:
        rows = {a.kind: a for a in s.scalars(select(Action).where(Action.kind.like("validation-%")))}
        # The emulator serves no Jobs API: creating one would have failed the step.
        failed = list(s.scalars(select(Action.kind).where(Action.status != "dry_run")))
        reasons = list(s.scalars(select(Transition.reason).order_by(Transition.id)))
        evidence = [e for e in s.scalars(select(Transition.evidence)) if e and "validation" in e]
    assert failed == [], failed
    job = rows["validation-job"]
    assert job.status == "dry_run" and job.target == "gpu-07" and job.incident_id is not None
    manifest = job.detail["manifest"]
    assert job.detail["namespace"] == "healer-system" and manifest["kind"] == "Job"
    assert manifest["metadata"]["name"] == job.detail["job"]
    pod = manifest["spec"]["template"]["spec"]
    assert pod["nodeName"] == "gpu-07"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert pod["containers"][0]["image"] == "registry.example.com/dcgm:1"
    assert (
        rows["validation-cleanup"].status == "dry_run"
        and rows["validation-cleanup"].detail["job"] == (job.detail["job"])
    )
    assert f"validation Job {job.detail['job']} passed" in reasons, reasons
    # The record says the pass is dry-run's, not a Job's.
    assert evidence and evidence[0]["validation"]["result"]["dry_run"] is True


def test_validation_jobs_off_means_no_validator(
    emulator: KubernetesEmulator, session_factory: sessionmaker[Session], k8s_settings: KubernetesSettings
) -> None:
    api = emulator.api_client()
    actions = RecordingNodeActions(
        KubernetesNodeActions(api, k8s_settings, identity="healer-0"), session_factory, clock=lambda: T0
    )
    assert validation_jobs(Settings(kubernetes=k8s_settings), api, actions) is None
    acting = Settings(kubernetes=k8s_settings, validation=ValidationSettings(enabled=True))
    assert isinstance(validation_jobs(acting, api, actions.reader), ValidationJobs)  # type: ignore[arg-type]
    api.close()
