"""Record: one step's transition, remediation memory, audit rows and ticket, in the caller's
transaction (the outbox row is written with the step, so a ticket exists iff its step does)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.controller.apply import Done
from healer.controller.observe import Rows, incident_facts, recorded_findings
from healer.engine import lifecycle as lc
from healer.engine import safety
from healer.model.drain import DrainReport
from healer.model.findings import Finding
from healer.model.states import ActionStatus, NodeState
from healer.store import nodes as repo
from healer.store import outcomes
from healer.store.models import Action, Incident, Node


@dataclass(frozen=True)
class Recorder:
    """Who records (``actor``) and when (``now``); ``audited`` is true when the action adapter writes
    its own rows for what it applies (the dry-run recorder), so only notifications and failures are
    added here."""

    actor: str
    now: datetime
    audited: bool = False
    holder: str | None = None
    fencing_token: int | None = None
    #: Shadow rules: their findings are never hung on an incident (nor a ticket's evidence).
    skip_rules: frozenset[str] = frozenset()
    #: How long a new ticket waits for the log capture asked of the node agent, seconds, counted
    #: from the request (``repair.capture_wait_seconds``; 0: tickets are never held).
    capture_wait_seconds: float = 0.0

    def step(
        self,
        session: Session,
        rows: Rows,
        step: lc.Step,
        done: Sequence[Done],
        *,
        firing: list[Finding],
        expect: str | None = None,
        attached: set[int] | None = None,
        clear_intent: bool = False,
        moved: bool = False,
        gpus: int | None = None,
    ) -> None:
        """Incident changes, memory, drain start, audit rows, tickets, transition.

        ``rows``: the node's row and open incident as the caller's transaction holds them; updated
        to what the step leaves (the incident it opened, None when it closed it). ``attached``: the
        incidents whose findings this pass has attached (an incident opened here is added).

        ``expect``: the state the step was decided from (the transition is a compare-and-set on
        it; ``StaleState`` when the node moved meanwhile, and the caller's transaction rolls back).
        ``clear_intent``: clear the node's ``intent`` (with the transition's UPDATE when it has one).
        ``moved``: the caller has done the compare-and-set already (:func:`healer.store.nodes.move`,
        before any other write of the record, so a stale one leaves nothing half written).
        ``gpus``: the node's GPU capacity as read this step, for the GPU-hours of an incident it
        closes (:func:`healer.store.outcomes.settle`).
        """
        now = self.now
        node, incident = rows.node, rows.incident
        if clear_intent and step.to is None:
            node.intent = None
        if step.new_incident and incident is not None:
            _close(incident, now=now, reason=step.close_incident or "superseded")
            session.flush()
            outcomes.settle(session, incident, now=now, gpus=gpus)
            incident = None
        if incident is None and (step.open_incident or step.new_incident):
            incident = repo.new_incident(
                session, node, now=now, summary=step.reason, before_insert=lambda i: _remember(i, step)
            )
            repo.attach_findings(session, node, incident, skip_rules=self.skip_rules)
            rows.ticket, rows.ticket_read = None, True
            if attached is not None:
                attached.add(incident.id)
        elif incident is not None:
            _remember(incident, step)
        for effect in step.effects:
            if isinstance(effect, lc.StartDrain) and incident is not None:
                incident.drain_started_at = now
                incident.drain_options = asdict(effect.options)
                repo.record_action(
                    session,
                    kind="drain",
                    status=ActionStatus.RUNNING,
                    actor=self.actor,
                    now=now,
                    node=node,
                    incident=incident,
                    detail={"rule": effect.rule, "options": incident.drain_options},
                )
        self.effects(session, node, incident, done, step)
        tickets = [e for e in step.effects if isinstance(e, lc.RequestTicket)]
        if tickets and incident is not None:
            from healer.tickets.outbox import request_ticket

            evidence = firing or recorded_findings(session, node, incident)
            rows.ticket_read = False  # the outbox row just written has a status
            for t in tickets:
                request_ticket(
                    session,
                    incident=incident,
                    node=node,
                    provider=t.provider,
                    template=t.template,
                    findings=evidence,
                    now=now,
                    hold_until=self._capture_due(incident),
                )
        answered = step.memory.capture
        if answered is not None and answered.get("status") != "requested" and incident is not None:
            from healer.tickets.outbox import release_held

            release_held(session, incident_id=incident.id, now=now)
        if expect == NodeState.DRAINING and step.to is not None and step.to != NodeState.DRAINING:
            _end_drain(session, node, why=step.reason, now=now)
        if step.to is not None:
            repo.transition(
                session,
                node,
                step.to,
                now=now,
                actor=self.actor,
                reason=step.reason,
                evidence=step.evidence,
                incident=incident,
                expect=expect,
                holder=self.holder,
                fencing_token=self.fencing_token,
                clear_intent=clear_intent,
                moved=moved,
            )
        if step.close_incident is not None and not step.new_incident and incident is not None:
            _close(incident, now=now, reason=step.close_incident)
            outcomes.settle(session, incident, now=now, gpus=gpus)
            incident = None
        rows.incident = incident

    def _capture_due(self, incident: Incident) -> datetime | None:
        """Until when a new ticket of ``incident`` waits for its log bundle: the capture's request
        time plus the wait, while the capture is unanswered; None: not held."""
        capture = incident.capture or {}
        if self.capture_wait_seconds <= 0 or capture.get("status") != "requested":
            return None
        try:
            asked = datetime.fromisoformat(str(capture.get("requested_at")))
        except ValueError:
            return None
        return asked + timedelta(seconds=self.capture_wait_seconds)

    def effects(
        self, session: Session, node: Node, incident: Incident | None, done: Sequence[Done], step: lc.Step
    ) -> None:
        """One audit row per effect and incident (and one for each effect that failed), in one
        INSERT: an effect the incident already has a row for (the same cordon, taint value or
        condition, retried) adds none; one healer finds applied with no row yet (its process died
        between the write and the record) is recorded once, "found applied after restart"."""
        done = [d for d in done if not (self.audited and d.kind != "notify" and d.error is None)]
        seen = _recorded_effects(session, incident, done)
        rows = []
        for d in done:
            if d.error is None and d.kind in _ONCE:
                key = (d.kind, _effect_key(d.kind, d.detail))
                if key in seen:
                    continue
                seen.add(key)
            detail = {**d.detail, "step": step.row}
            if d.error is None and d.kind in _ONCE:
                detail["how"] = "found applied after restart" if d.found else "applied"
            elif d.found:
                continue  # a no-op write of a kind not kept once per incident: nothing happened
            rows.append(
                repo.record_action(
                    session,
                    add=False,
                    kind=d.kind,
                    status=d.status,
                    actor=self.actor,
                    now=self.now,
                    node=node,
                    incident=incident,
                    error=d.error,
                    detail=detail,
                )
            )
        repo.insert_actions(session, rows)

    def refusal(self, session: Session, node: Node, step: lc.Step, decision: safety.Decision) -> bool:
        """Record a refused step once per reason while the node stays in its state; a refusal that
        blocks moves the node to ``blocked``. Returns whether the node moved."""
        incident = repo.open_incident(session, node)
        reason = str(decision.reason)
        moves = decision.blocks and node.state != NodeState.BLOCKED
        if moves:
            # The compare-and-set first: a stale one raises before anything of the refusal is written.
            repo.transition(
                session,
                node,
                NodeState.BLOCKED,
                now=self.now,
                actor=self.actor,
                reason=f"{reason}: {decision.message}",
                evidence=step.evidence,
                incident=incident,
                expect=node.state,
                holder=self.holder,
                fencing_token=self.fencing_token,
            )
        seen = session.scalar(
            select(Action.id)
            .where(
                Action.node_id == node.id,
                Action.kind == str(step.kind),
                Action.status == ActionStatus.REFUSED,
                Action.error == reason,
                Action.created_at >= node.state_since,
            )
            .limit(1)
        )
        if seen is None:
            repo.record_action(
                session,
                kind=str(step.kind),
                status=ActionStatus.REFUSED,
                actor=self.actor,
                now=self.now,
                node=node,
                incident=incident,
                error=reason,
                detail={"message": decision.message, "wanted": step.to and str(step.to), "step": step.row},
            )
        if decision.blocks and incident is not None:
            if incident.blocked_step is None:
                incident.blocked_step = "quarantine"
            incident.blocked_reason = f"{reason}: {decision.message}"
        return moves

    def drain_progress(
        self, session: Session, node: Node, *, error: str | None, report: DrainReport | None
    ) -> None:
        """Update the drain's action row: attempts, evicted pods so far, when the first eviction
        went out, the checkpoint conversation per pod (asked, answered or deadline) and its final
        status."""
        row = session.scalar(
            select(Action)
            .where(Action.node_id == node.id, Action.kind == "drain", Action.status == ActionStatus.RUNNING)
            .order_by(Action.id.desc())
            .limit(1)
        )
        if row is None:
            return
        detail = dict(row.detail or {})
        row.attempts += 1
        row.updated_at = self.now
        row.error = error
        if report is not None:
            detail["evicted"] = sorted(set(detail.get("evicted", [])) | set(report.evicted))
            detail["remaining"] = list(report.remaining)
            detail["kept"] = list(report.kept)
            detail["errors"] = dict(report.errors)  # pod -> why its eviction failed this round (retried)
            if report.deleted:
                detail["deleted"] = sorted(set(detail.get("deleted", [])) | set(report.deleted))
            if report.evicted and "first_eviction_at" not in detail:
                detail["first_eviction_at"] = self.now.isoformat()
            if report.checkpoints or report.checkpointing:
                # pod -> requested_at, deadline, acknowledged_at | deadline_passed_at (read back
                # from the pod's annotations each step, so later steps only add the answer).
                seen = dict(detail.get("checkpoints", {}))
                for pod, times in report.checkpoints.items():
                    seen[pod] = {**seen.get(pod, {}), **times}
                detail["checkpoints"] = seen
                detail["checkpointing"] = list(report.checkpointing)
            if report.stopped:
                detail["stopped"] = report.stopped
            if report.done:
                row.status = ActionStatus.SUCCEEDED
            elif report.blocked or report.refused:
                row.status = ActionStatus.BLOCKED
                detail["blocked_pods"] = list(report.blocked_pods)
                detail["budgets"] = list(report.budgets)
                detail["refused"] = dict(report.refused)
                row.error = "drain blocked" if report.blocked else "drain refused"
        row.detail = detail


#: Effects recorded at most once per incident (the same effect found or applied again is one row).
_ONCE = frozenset({"cordon", "taint", "condition", "release"})


def _effect_key(kind: str, detail: dict[str, object]) -> str:
    """What makes two effects of ``kind`` the same effect: the taint's value and effect, the
    condition's status and reason; a cordon and a release are one per incident."""
    if kind == "taint":
        return f"{detail.get('value')}:{detail.get('effect')}"
    if kind == "condition":
        return f"{detail.get('healthy')}:{detail.get('reason')}"
    return ""


def _recorded_effects(
    session: Session, incident: Incident | None, done: Sequence[Done]
) -> set[tuple[str, str]]:
    """The (kind, key) of the effects ``incident`` already has a succeeded audit row for, among
    the kinds in ``done`` (no query when there are none)."""
    kinds = {d.kind for d in done if d.error is None and d.kind in _ONCE}
    if incident is None or incident.id is None or not kinds:
        return set()
    rows = session.execute(
        select(Action.kind, Action.detail).where(
            Action.incident_id == incident.id,
            Action.kind.in_(sorted(kinds)),
            Action.status == ActionStatus.SUCCEEDED,
        )
    )
    return {(kind, _effect_key(kind, detail or {})) for kind, detail in rows}


def _end_drain(session: Session, node: Node, *, why: str, now: datetime) -> None:
    """A drain left unfinished (a human took the node over, the node was deleted, ...): its row,
    still ``running``, ends ``cancelled`` with the reason, instead of running forever."""
    for row in session.scalars(
        select(Action).where(
            Action.node_id == node.id, Action.kind == "drain", Action.status == ActionStatus.RUNNING
        )
    ):
        row.status = ActionStatus.CANCELLED
        row.updated_at = now
        row.error = why[:500]


def _close(incident: Incident, *, now: datetime, reason: str) -> None:
    incident.closed_at = now
    incident.close_reason = reason


def _remember(incident: Incident, step: lc.Step) -> None:
    """Write the step's memory (``lifecycle.remember``) to the incident row."""
    after = lc.remember(incident_facts(incident), step)
    incident.rule = after.rule
    incident.cordoned_by_healer = after.cordoned_by_healer
    incident.expect_unschedulable = after.expect_unschedulable
    incident.clear_since = after.clear_since
    if step.memory.ladder is not None:
        incident.ladder = [stp.model_dump(mode="json") for stp in after.ladder]
    incident.ladder_index = after.ladder_index
    incident.ladder_started_at = after.ladder_started_at
    incident.repair_nonce = after.repair_nonce
    incident.validation = after.validation
    incident.release_requested = after.release_requested
    incident.capture = after.capture
    if step.memory.blocked_step is not None:
        incident.blocked_reason = step.reason
    elif after.blocked_step is None:
        incident.blocked_reason = None  # the step took the node out of blocked
    incident.blocked_step = after.blocked_step
