"""The log capture at quarantine: with a node agent, taking a node out asks it for the log bundle
(its own nonce); its answer is recorded with the bundle, never confused with a repair's."""

from __future__ import annotations

from dataclasses import replace

from healer.engine import lifecycle as lc
from healer.model.node import NodeView
from healer.model.repair import RepairResult
from healer.model.states import NodeState
from healer.model.validation import ValidationResult
from healer.store.models import Incident
from healer.tickets.payloads import log_bundle_note
from tests.unit import test_ladder as ladder
from tests.unit.test_lifecycle import CORDONED, CTX, HOT, NOW, facts, incident

#: A node agent answers: the rule GpuTooHot quarantines, drains and asks for its ticket (no ladder).
AGENT = replace(CTX, repair_actions=frozenset({"reboot"}), capture_logs=True)
#: The rule Own's ladder: reboot, notify, ticket.
LADDER = replace(ladder.CTX, capture_logs=True)


def capture_of(step: lc.Step) -> lc.RequestRepair:
    (request,) = [e for e in step.effects if isinstance(e, lc.RequestRepair) and e.action == "capture"]
    return request


def quarantined(
    suspect: lc.NodeFacts, ctx: lc.Context = AGENT
) -> tuple[lc.NodeFacts, lc.Step, lc.RequestRepair]:
    """The facts once ``suspect`` is quarantined (memory remembered), the step and its capture."""
    step = lc.decide(suspect, ctx)
    assert step is not None and step.row == "quarantine" and step.to == NodeState.QUARANTINED
    assert suspect.incident is not None
    after = replace(
        suspect, state=NodeState.QUARANTINED, incident=lc.remember(suspect.incident, step), view=CORDONED
    )
    return after, step, capture_of(step)


def then(facts: lc.NodeFacts, step: lc.Step, **kw: object) -> lc.NodeFacts:
    assert facts.incident is not None
    return replace(facts, state=step.to or facts.state, incident=lc.remember(facts.incident, step), **kw)  # type: ignore[arg-type]


def hot() -> lc.NodeFacts:
    return facts(NodeState.SUSPECT, incident=incident(), firing=HOT)


def rebooting() -> tuple[lc.NodeFacts, lc.RequestRepair, lc.Step, lc.RequestRepair]:
    """Rule Own's node quarantined (the capture asked), then its ladder's step: the facts once
    quarantined, the capture, the step and its reboot request (quarantined, no drain)."""
    suspect = lc.NodeFacts(
        name="n1",
        state=NodeState.SUSPECT,
        incident=lc.IncidentFacts(id=7),
        firing=(ladder.xid(1.0, rule="Own"),),
        view=NodeView(name="n1", unschedulable=False),
    )
    out, _, capture = quarantined(suspect, LADDER)
    start = lc.decide(out, LADDER)
    assert start is not None and start.row == "quarantined, no drain"
    reboot = next(e for e in start.effects if isinstance(e, lc.RequestRepair))
    return out, capture, start, reboot


def test_quarantine_with_an_agent_asks_for_the_log_bundle() -> None:
    _, step, request = quarantined(hot())
    assert request.gpu is None and request.nonce == f"7-capture-{int(NOW.timestamp())}"
    # After the node is out of scheduling: the cordon and taint lead the step (one patch).
    assert [type(e).__name__ for e in step.effects][:2] == ["Cordon", "Taint"]
    assert step.memory.capture == {
        "nonce": request.nonce,
        "requested_at": NOW.isoformat(),
        "status": "requested",
    }


def test_quarantine_without_an_agent_asks_for_nothing() -> None:
    step = lc.decide(hot(), CTX)
    assert step is not None and step.row == "quarantine"
    assert not any(isinstance(e, lc.RequestRepair) for e in step.effects)
    assert step.memory.capture is None


def test_the_capture_answer_is_recorded_with_its_bundle_where_the_node_is() -> None:
    out, _, request = quarantined(hot())
    answer = RepairResult(
        request.nonce, "succeeded", "log bundle captured", "2026-12-04T10:00:07Z", bundle="H4sI"
    )
    for state in (NodeState.QUARANTINED, NodeState.DRAINING, NodeState.AWAITING_REPAIR):
        got = lc.decide(replace(out, state=state, firing=(), repair_result=answer), AGENT)
        assert got is not None and got.row == "capture answered", state
        assert got.to == state and got.kind == lc.StepKind.RECORD and not got.effects
        assert got.evidence == {
            "repair": {
                "action": "capture",
                "nonce": request.nonce,
                "status": "succeeded",
                "reason": "log bundle captured",
                "at": "2026-12-04T10:00:07Z",
                "log_bundle": "H4sI",
            }
        }
    # Once recorded, the same answer is not recorded again.
    recorded = lc.decide(replace(out, repair_result=answer), AGENT)
    assert recorded is not None
    after = then(out, recorded, repair_result=answer)
    assert after.incident is not None and after.incident.capture is not None
    assert after.incident.capture["status"] == "succeeded"
    again = lc.decide(after, AGENT)
    assert again is None or again.row != "capture answered"
    # Not in the drain pass: its steps are the drain's.
    draining = replace(out, state=NodeState.DRAINING, repair_result=answer, drain_due=True)
    drain = lc.decide(draining, AGENT)
    assert drain is not None and drain.row == "drain step"


def test_an_older_agent_refusing_the_capture_is_recorded_without_a_bundle() -> None:
    out, _, request = quarantined(hot())
    refused = RepairResult(request.nonce, "refused", "unknown action 'capture'", "t")
    got = lc.decide(replace(out, repair_result=refused), AGENT)
    assert got is not None and got.row == "capture answered"
    assert got.reason == "log capture refused on the node (unknown action 'capture')"
    assert got.evidence is not None and "log_bundle" not in got.evidence["repair"]  # type: ignore[operator]
    assert got.memory.capture is not None and got.memory.capture["reason"] == "unknown action 'capture'"


def test_a_reboot_answer_is_not_a_capture_answer_nor_the_other_way_round() -> None:
    out, capture, start, reboot = rebooting()
    assert reboot.action == "reboot" and reboot.nonce != capture.nonce
    awaiting = then(out, start)
    # The capture's answer while the reboot is awaited: recorded as the capture, the reboot still awaited.
    captured = RepairResult(capture.nonce, "succeeded", "log bundle captured", "t1", bundle="H4sIcap")
    got = lc.decide(replace(awaiting, repair_result=captured), LADDER)
    assert got is not None and got.row == "capture answered" and got.to == NodeState.AWAITING_REPAIR
    recorded = then(awaiting, got)
    assert recorded.incident is not None and recorded.incident.repair_nonce == reboot.nonce
    assert lc.decide(replace(recorded, repair_result=captured), LADDER) is None  # awaiting the agent
    # The reboot's answer: the repair is done (its own bundle kept), the capture left as recorded.
    rebooted = RepairResult(reboot.nonce, "succeeded", "reboot started", "t2", bundle="H4sIboot")
    done = lc.decide(replace(recorded, repair_result=rebooted), LADDER)
    assert done is not None and done.row == "repair done" and done.to == NodeState.REPAIRED
    assert done.evidence is not None and done.evidence["repair"]["log_bundle"] == "H4sIboot"  # type: ignore[index]
    assert done.memory.capture is None
    # The reboot's answer before the capture's is recorded: never taken for the capture.
    first = lc.decide(replace(awaiting, repair_result=rebooted), LADDER)
    assert first is not None and first.row == "repair done"


def test_a_failed_validation_job_asks_for_the_bundle_with_its_replacement_ticket() -> None:
    held = incident(
        rule="GpuTooHot",
        cordoned_by_healer=True,
        expect_unschedulable=True,
        validation={"job": "healer-validate-7-1", "status": "running"},
    )
    result = ValidationResult(status="failed", exit_code=1, result={"why": "memtest"})
    validating = facts(NodeState.VALIDATING, incident=held, view=CORDONED, validation=result)
    step = lc.decide(validating, replace(AGENT, validate_with_job=True))
    assert step is not None and step.row == "validation Job failed" and step.new_incident
    names = [type(e).__name__ for e in step.effects]
    assert names.index("RequestRepair") < names.index("RequestTicket")
    assert step.memory.capture is not None and step.memory.capture["status"] == "requested"


def test_the_ticket_says_why_it_has_no_bundle_though_one_was_asked() -> None:
    asked = {"nonce": "7-capture-1", "requested_at": NOW.isoformat(), "status": "requested"}
    bundle = {"action": "capture", "captured_at": "t", "text": "..."}
    assert log_bundle_note(Incident(capture=None), None) is None  # none asked: nothing to say
    assert log_bundle_note(Incident(capture=asked), bundle) is None
    assert log_bundle_note(Incident(capture=asked), None) == (
        f"the node agent did not answer the log capture asked at {NOW.isoformat()}"
    )
    refused = {**asked, "status": "refused", "reason": "unknown action 'capture'"}
    assert log_bundle_note(Incident(capture=refused), None) == (
        "the node agent refused the log capture: unknown action 'capture'"
    )
    failed = {**asked, "status": "failed", "reason": "no log bundle captured"}
    assert log_bundle_note(Incident(capture=failed), None) == (
        "the node agent failed the log capture: no log bundle captured"
    )


def test_a_repair_asked_before_the_capture_was_answered_supersedes_it_and_its_ticket_is_not_held() -> None:
    """The agent holds one request at a time: the ladder's reboot, asked as the node is held,
    replaced the capture. The reboot's answer carries the bundle; the capture ends ``superseded``
    and the replacement ticket that follows a failed reboot is not held for it."""
    out, _, start, reboot = rebooting()
    awaiting = then(out, start)
    assert awaiting.incident is not None and awaiting.incident.capture is not None
    assert awaiting.incident.capture["status"] == "requested"
    # The reboot fails; its answer carries the bundle captured before it.
    failed = RepairResult(reboot.nonce, "failed", "ipmitool: no BMC", "t2", bundle="H4sIboot")
    step = lc.decide(replace(awaiting, repair_result=failed), LADDER)
    assert step is not None and step.row == "repair failed"
    assert step.evidence is not None and step.evidence["repair"]["log_bundle"] == "H4sIboot"  # type: ignore[index]
    assert step.memory.capture is not None
    assert step.memory.capture["status"] == "superseded" and step.memory.capture["answered_at"] == "t2"
    assert step.memory.capture["reason"] == (
        "the reboot request replaced it; the reboot answer carries the log bundle"
    )
    after = then(awaiting, step)
    assert after.incident is not None and after.incident.capture is not None
    assert after.incident.capture["status"] == "superseded"
    # A later answer to the old capture nonce is not recorded as one (it was superseded).
    late = RepairResult(str(after.incident.capture["nonce"]), "succeeded", "captured", "t3", bundle="x")
    again = lc.decide(replace(after, repair_result=late), LADDER)
    assert again is None or again.row != "capture answered"
    # Without a bundle, the ticket says why it has none.
    bare = lc.decide(replace(awaiting, repair_result=replace(failed, bundle=None)), LADDER)
    assert bare is not None and bare.memory.capture is not None
    assert log_bundle_note(Incident(capture=bare.memory.capture), None) == (
        "the node agent answered a repair instead of the log capture "
        "(the reboot request replaced it; the reboot answer has no log bundle)"
    )


def test_a_reset_answered_after_the_capture_leaves_the_capture_as_recorded() -> None:
    """The capture answered first keeps its own status: a later repair answer changes nothing."""
    out, capture, start, reboot = rebooting()
    awaiting = then(out, start)
    captured = RepairResult(capture.nonce, "succeeded", "log bundle captured", "t1", bundle="H4sIcap")
    recorded = then(awaiting, lc.decide(replace(awaiting, repair_result=captured), LADDER))  # type: ignore[arg-type]
    failed = RepairResult(reboot.nonce, "failed", "ipmitool: no BMC", "t2")
    step = lc.decide(replace(recorded, repair_result=failed), LADDER)
    assert step is not None and step.row == "repair failed" and step.memory.capture is None
