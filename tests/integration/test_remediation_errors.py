"""Errors that must not escape (a slow eviction, a broken connection, a step retried after a
failure) and what a killed process leaves on the cluster (the ownership reconcile).

Over HTTP against the API emulator, on SQLite and PostgreSQL: a Kubernetes call slower than the
request timeout (urllib3's ``ReadTimeoutError``) or a transport failure fails that node's step
only, never the pass for every node; a retried step records only the effects it performed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.apiretry import WRITE_ATTEMPTS
from healer.config import KubernetesSettings
from healer.controller import ownership
from healer.model.findings import TickFindings
from healer.model.node import NodeEdit, Ownership
from healer.model.states import ActionStatus, NodeState
from healer.store import nodes as repo
from healer.store.models import Incident, Node
from healer.store.session import transaction
from healer_dev.k8s_emulator import KubernetesEmulator, pod
from healer_dev.remediation_harness import T0, Harness, fleet_nodes, hot, tick
from tests.k8s_emulator import emulator, k8s_settings
from tests.services import wait_until

__all__ = ["emulator", "k8s_settings"]


@pytest.fixture
def harness(
    emulator: KubernetesEmulator, session_factory: sessionmaker[Session], k8s_settings: KubernetesSettings
) -> Iterator[Harness]:
    """A controller whose every Kubernetes request times out after 1 s."""
    h = Harness(emulator, session_factory, k8s_settings.model_copy(update={"request_timeout_seconds": 1}))
    yield h
    h.api.close()


def _web(name: str, node_name: str) -> dict[str, object]:
    return pod(
        name, node_name=node_name, namespace="web", owner=("ReplicaSet", "web-1"), labels={"app": "web"}
    )


def test_an_eviction_slower_than_the_timeout_fails_that_node_only(harness: Harness) -> None:
    harness.emu.load([*fleet_nodes(20), _web("web-a", "gpu-01"), _web("web-b", "gpu-02")])
    harness.remediate(tick(T0, hot("gpu-01"), hot("gpu-02")))
    assert {harness.state("gpu-01"), harness.state("gpu-02")} == {NodeState.DRAINING}
    harness.emu.inject_delay("POST", r"/pods/web-a/eviction$", 3)

    result = harness.drains(T0 + timedelta(seconds=10))  # no exception: the pass went on

    assert harness.emu.pods_on("gpu-02") == [], "the other node's drain went on"
    assert harness.state("gpu-02") == NodeState.AWAITING_REPAIR
    assert harness.state("gpu-01") == NodeState.DRAINING, "the slow node stays draining, to retry"
    assert [o.node for o in result.outcomes if o.error] == []
    drain = harness.actions_of("gpu-01", kind="drain")[-1]
    assert drain.status == ActionStatus.RUNNING
    assert drain.detail is not None and drain.detail["remaining"] == ["web/web-a"]

    # The slow eviction did happen server-side; the next round sees the pod gone and finishes.
    harness.drains(T0 + timedelta(seconds=20))
    assert harness.state("gpu-01") == NodeState.AWAITING_REPAIR


def test_a_connection_error_fails_that_node_step_only(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    # the cordon patch times out, each of its tries
    harness.emu.inject_delay("PATCH", r"/api/v1/nodes/gpu-04$", 3, times=WRITE_ATTEMPTS)

    result = harness.remediate(tick(T0, hot("gpu-04"), hot("gpu-05")))

    errors = {o.node: o.error for o in result.outcomes if o.error}
    assert list(errors) == ["gpu-04"] and "ReadTimeoutError" in str(errors["gpu-04"])
    assert harness.state("gpu-05") == NodeState.DRAINING
    failed = harness.actions_of("gpu-04", status=ActionStatus.FAILED)
    assert [a.kind for a in failed] == ["cordon"] and "timed out" in (failed[0].error or "")


def test_a_retried_step_records_each_effect_once(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    # The condition (a status patch) fails, each of its tries: cordon and taint were done, the step
    # was not.
    harness.emu.inject_error("PATCH", r"/api/v1/nodes/gpu-06/status$", 500, times=WRITE_ATTEMPTS)

    first = harness.remediate(tick(T0, hot("gpu-06")))
    assert [o.node for o in first.outcomes if o.error] == ["gpu-06"]
    harness.remediate(tick(T0 + timedelta(seconds=30), hot("gpu-06")))

    assert harness.state("gpu-06") == NodeState.DRAINING
    done = [(a.kind, a.status) for a in harness.actions_of("gpu-06")]
    assert done.count(("cordon", ActionStatus.SUCCEEDED)) == 1
    assert done.count(("taint", ActionStatus.SUCCEEDED)) == 1
    assert done.count(("condition", ActionStatus.SUCCEEDED)) == 1
    assert done.count(("setcondition", ActionStatus.FAILED)) == 1


def test_a_quarantine_whose_answers_were_lost_completes_in_the_same_pass(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    # The API server applies the cordon patch and the Event, but answers each after the 1 s timeout.
    harness.emu.inject_delay("PATCH", r"/api/v1/nodes/gpu-03$", 2, after_write=True)
    harness.emu.inject_delay("POST", r"/events$", 2, after_write=True)

    result = harness.remediate(tick(T0, hot("gpu-03")))

    assert [o.error for o in result.outcomes] == [None]
    assert harness.state("gpu-03") == NodeState.DRAINING
    # The patch was sent again; its resourceVersion precondition refused it (409) and the node,
    # read again, was found done: nothing more was sent.
    sent = [(m, p.split("?")[0]) for m, p in harness.emu.requests]
    patches = [p for m, p in sent if m == "PATCH" and p == "/api/v1/nodes/gpu-03"]
    assert len(patches) == 2
    events = harness.emu.list("Event", api_version="events.k8s.io/v1")
    about = [(e["regarding"]["name"], e["reason"]) for e in events]
    quarantined = [e for e in about if e == ("gpu-03", "HealerQuarantined")]
    assert len(quarantined) == 1, "the Event's retry found it created, and made no second one"
    done = [(a.kind, a.status) for a in harness.actions_of("gpu-03")]
    assert done.count(("cordon", ActionStatus.SUCCEEDED)) == 1


def test_a_reason_that_changes_between_retries_is_still_one_cordon(harness: Harness) -> None:
    """Issue 24: a retried quarantine whose reason text changed (89 C, then 90 C) rewrote the reason
    annotation and recorded a second "cordon succeeded"; it is one cordon, one row."""
    harness.emu.load(fleet_nodes(20))
    harness.emu.inject_error("PATCH", r"/api/v1/nodes/gpu-06/status$", 500, times=WRITE_ATTEMPTS)
    harness.remediate(tick(T0, replace(hot("gpu-06"), value=89.0, summary="GPU 3 at 89 C")))
    harness.remediate(
        tick(T0 + timedelta(seconds=30), replace(hot("gpu-06"), value=90.0, summary="GPU 3 at 90 C"))
    )

    assert harness.state("gpu-06") == NodeState.DRAINING
    rows = [a for a in harness.actions_of("gpu-06") if a.status == ActionStatus.SUCCEEDED]
    assert [a.kind for a in rows].count("cordon") == 1
    assert [a.kind for a in rows].count("taint") == 1


def _marked_by_a_dead_process(harness: Harness, name: str) -> None:
    """What a process killed between its cordon and its record leaves: the node cordoned, tainted,
    annotated by healer, with nothing in the database."""
    harness.actions.edit(
        harness.actions.read_node(name),
        NodeEdit(
            cordon=Ownership(incident_id=7, reason="GpuTooHot", at=T0), taint=("GpuTooHot", "NoSchedule")
        ),
    )


def test_marks_the_record_does_not_account_for_are_released_or_adopted(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    _marked_by_a_dead_process(harness, "gpu-07")  # its finding is gone
    _marked_by_a_dead_process(harness, "gpu-08")  # its finding still fires
    findings = tick(T0 + timedelta(minutes=1), hot("gpu-08"))

    settled = ownership.settle(
        owned=harness.actions.owned_nodes,
        actions=harness.actions,
        sessions=harness.sessions,
        findings=findings,
        now=findings.at,
    )
    harness.remediate(findings)

    assert (settled.released, settled.adopted) == (["gpu-07"], ["gpu-08"])
    released = harness.k8s_node("gpu-07")
    assert not released["spec"].get("unschedulable") and not released["spec"].get("taints")
    assert not any(k.startswith("healer.dev/") for k in released["metadata"].get("annotations", {}))
    assert harness.state("gpu-07") == NodeState.HEALTHY
    assert [a.kind for a in harness.actions_of("gpu-07")] == ["release"]
    adopted = harness.k8s_node("gpu-08")
    assert adopted["spec"]["unschedulable"] is True
    assert harness.state("gpu-08") == NodeState.DRAINING
    with harness.sessions() as s:
        incident = s.scalars(select(Incident).join(Node).where(Node.name == "gpu-08")).one()
    assert adopted["metadata"]["annotations"]["healer.dev/incident"] == str(incident.id)
    # One audit row per effect (issue 24): the dead process's cordon and taint have no row yet, so
    # the retried step records each once, saying how it learned of it.
    how = [
        (a.kind, (a.detail or {}).get("how"))
        for a in harness.actions_of("gpu-08")
        if a.kind in ("cordon", "taint", "condition") and a.status == ActionStatus.SUCCEEDED
    ]
    assert sorted(how) == [
        ("condition", "applied"),
        ("cordon", "found applied after restart"),
        ("taint", "found applied after restart"),
    ]

    # While a rule's query fails, its finding may be firing unseen: nothing is released.
    _marked_by_a_dead_process(harness, "gpu-09")
    frozen = TickFindings(at=T0 + timedelta(minutes=2), frozen_rules=frozenset({"GpuTooHot"}))
    kept = ownership.settle(
        owned=harness.actions.owned_nodes,
        actions=harness.actions,
        sessions=harness.sessions,
        findings=frozen,
        now=frozen.at,
    )
    assert kept.released == [] and harness.k8s_node("gpu-09")["spec"]["unschedulable"] is True


def test_a_step_whose_state_moved_meanwhile_is_not_recorded(harness: Harness) -> None:
    """Compare-and-set: the quarantine was decided from `suspect`; while its cordon is in flight
    another writer (an operator, a provider callback) moves the node. The step's transition is not
    written over theirs; the cordon it did is audited."""
    harness.emu.load(fleet_nodes(20))
    harness.emu.inject_delay("PATCH", r"/api/v1/nodes/gpu-10$", 0.8, after_write=True)
    result: list[object] = []
    worker = threading.Thread(
        target=lambda: result.append(harness.remediate(tick(T0 + timedelta(seconds=5), hot("gpu-10"))))
    )
    worker.start()
    wait_until(
        lambda: harness.k8s_node("gpu-10")["spec"].get("unschedulable"), timeout=10, what="cordon applied"
    )
    with transaction(harness.sessions) as s:
        node = s.scalars(select(Node).where(Node.name == "gpu-10")).one()
        repo.transition(
            s, node, NodeState.RELEASED, now=T0 + timedelta(seconds=5), actor="sre", reason="by hand"
        )
    worker.join(timeout=30)

    assert harness.state("gpu-10") == NodeState.RELEASED
    assert [b for _, b in harness.path("gpu-10")] == ["suspect", "released"]
    assert [o.refused for o in result[0].outcomes] == ["stale"]  # type: ignore[attr-defined]
    assert [a.kind for a in harness.actions_of("gpu-10") if a.kind in ("cordon", "taint")] == [
        "cordon",
        "taint",
    ]
