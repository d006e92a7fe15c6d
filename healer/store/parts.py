"""The parts ledger: failures, repairs and their outcomes per part (GPU UUID, HCA), read from the record.

A failure is an incident's quarantine step; its evidence names the series' labels, so the part is
the GPU's ``UUID`` (its ``serial`` where the exporter exports one) or the HCA (``device`` on its
node). A part is a repeat offender when it fails in an incident opened after an incident of it
that was repaired (reached ``repaired``), on any node: the lifecycle sends it straight to
replacement (``healer.controller.observe``), and the dashboard (``/api/v1/parts``) and
``/metrics`` flag it.

Repair steps: each ladder step started (a ``repair-request`` action for reset-gpu/reboot, a ticket
per provider) is an attempt; it succeeded when its incident returned to service and it was the
incident's last repair step, else it escalated (or is still open). Time between failures: the
mean gap between a part's (or a node's) consecutive failures, seconds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.model.states import NodeState
from healer.store.models import Action, Incident, Node, Ticket, Transition

RETURNED = "returned to service"

#: How far back the dashboard's Parts page (by default), the node page's flag and ``/metrics`` look.
DEFAULT_WINDOW = timedelta(days=90)


@dataclass
class PartRecord:
    """One part: ``kind`` (gpu | hca), its id, where and when it failed, whether it came back."""

    kind: str
    id: str
    serial: str | None = None
    failures: list[tuple[datetime, str, int]] = field(default_factory=list)  # (at, node, incident)
    repaired_incidents: set[int] = field(default_factory=set)
    repeat: bool = False

    @property
    def nodes(self) -> list[str]:
        return sorted({node for _, node, _ in self.failures})

    @property
    def mean_time_between_failures_seconds(self) -> float | None:
        return _mean_gap([at for at, _, _ in self.failures])


@dataclass(frozen=True)
class StepOutcomes:
    """Attempts of one repair step (``reset-gpu``, ``reboot``, ``ticket``) with one provider."""

    step: str
    provider: str
    attempts: int
    succeeded: int

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.attempts if self.attempts else None


@dataclass
class Ledger:
    parts: list[PartRecord]
    steps: list[StepOutcomes]
    node_failures: dict[str, list[datetime]]

    def node_mtbf(self) -> dict[str, float]:
        """Node → mean time between its failures, seconds (nodes with two or more)."""
        out = {}
        for node, times in self.node_failures.items():
            gap = _mean_gap(times)
            if gap is not None:
                out[node] = gap
        return out


def _mean_gap(times: list[datetime]) -> float | None:
    ordered = sorted(times)
    if len(ordered) < 2:
        return None
    return (ordered[-1] - ordered[0]).total_seconds() / (len(ordered) - 1)


def _parts_of(evidence: dict[str, object] | None, node: str) -> list[tuple[str, str, str | None]]:
    out = []
    findings = (evidence or {}).get("findings")
    for item in findings if isinstance(findings, list) else []:
        labels = (item or {}).get("labels") or {} if isinstance(item, dict) else {}
        if not isinstance(labels, dict):
            continue
        if labels.get("UUID"):
            out.append(("gpu", str(labels["UUID"]), labels.get("serial")))
        elif labels.get("device"):
            out.append(("hca", f"{node}/{labels['device']}", None))
    return out


def ledger(session: Session, *, since: datetime) -> Ledger:
    """The ledger of incidents opened since ``since`` (a few queries over transitions, actions and
    tickets of that window)."""
    rows = session.execute(
        select(Transition.incident_id, Transition.to_state, Transition.at, Transition.evidence, Node.name)
        .join(Node, Node.id == Transition.node_id)
        .where(
            Transition.at >= since,
            Transition.to_state.in_([NodeState.QUARANTINED.value, NodeState.REPAIRED.value]),
            # a step recorded in place (a log capture's answer) is no new failure
            Transition.from_state != Transition.to_state,
        )
        .order_by(Transition.at, Transition.id)
    ).all()
    parts: dict[tuple[str, str], PartRecord] = {}
    node_failures: dict[str, list[datetime]] = defaultdict(list)
    repaired_at: dict[int, datetime] = {}
    for incident_id, to_state, at, _evidence, _node in rows:
        if to_state == NodeState.REPAIRED.value and incident_id is not None:
            repaired_at.setdefault(incident_id, at)
    for incident_id, to_state, at, evidence, node in rows:
        if to_state != NodeState.QUARANTINED.value or incident_id is None:
            continue
        node_failures[node].append(at)
        for kind, part_id, serial in _parts_of(evidence, node):
            record = parts.setdefault((kind, part_id), PartRecord(kind, part_id, serial))
            if any(i == incident_id for _, _, i in record.failures):
                continue  # one failure per part per incident (two rules on one GPU are one failure)
            if any(repaired_at.get(i) is not None and repaired_at[i] <= at for _, _, i in record.failures):
                record.repeat = True
            record.failures.append((at, node, incident_id))
            if incident_id in repaired_at:
                record.repaired_incidents.add(incident_id)
    return Ledger(
        parts=sorted(parts.values(), key=lambda p: (not p.repeat, p.kind, p.id)),
        steps=_step_outcomes(session, since),
        node_failures=dict(node_failures),
    )


def _step_outcomes(session: Session, since: datetime) -> list[StepOutcomes]:
    started: dict[int, list[tuple[datetime, str, str]]] = defaultdict(list)  # incident → (at, step, provider)
    for incident_id, at, detail in session.execute(
        select(Action.incident_id, Action.created_at, Action.detail).where(
            Action.kind == "repair-request", Action.created_at >= since, Action.incident_id.is_not(None)
        )
    ):
        started[incident_id].append((at, str((detail or {}).get("action", "?")), "node-agent"))
    for incident_id, at, provider in session.execute(
        select(Ticket.incident_id, Ticket.created_at, Ticket.provider).where(Ticket.created_at >= since)
    ):
        started[incident_id].append((at, "ticket", provider))
    returned = set(
        session.scalars(
            select(Incident.id).where(Incident.id.in_(list(started)), Incident.close_reason == RETURNED)
        )
    )
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for incident_id, steps in started.items():
        steps.sort()
        for i, (_, step, provider) in enumerate(steps):
            counts[(step, provider)][0] += 1
            if i == len(steps) - 1 and incident_id in returned:
                counts[(step, provider)][1] += 1
    return [StepOutcomes(step, provider, a, s) for (step, provider), (a, s) in sorted(counts.items())]
