"""What a ticket template sees: the render context, and the repeat-offender decision.

The context (payload version :data:`~healer.tickets.templates.PAYLOAD_VERSION`)::

    version           "1"
    idempotency_key   "healer-<cluster>-incident-<id>-<provider>"
    cluster           cluster name from settings
    provider          provider name the ticket goes to
    ticket_id         healer's ticket id (the callback path uses it)
    callback_url      "<dashboard_url>/api/v1/tickets/<ticket_id>/status"
    dashboard_url     "<dashboard_url>/nodes/<node>"
    created_at        ISO 8601, when healer requested the ticket
    title, summary    one line / a few lines of plain text
    severity          highest severity among the findings ("critical" > "warning" > "info")
    node              {"name", "pool", "state", "url"}
    incident          {"id", "opened_at", "summary"}
    gpus              [{"uuid", "index", "pci_bus_id", "model", "rules": [rule, ...]}]  GPUs the
                      findings name, from the gpus table, else from the dcgm-exporter labels
                      (UUID, gpu, pci_bus_id, modelName)
    findings          [{"rule", "gpu", "severity", "value", "unit", "labels", "since", "fired_at",
                       "summary"}]  value is a number, "NaN", "+Inf", "-Inf" or null
    rules             sorted rule names
    drain             null, or when the node's drain is blocked: {"blocked_pods": [...],
                      "budgets": [...] (PodDisruptionBudgets "namespace/name"), "refused": {pod: why}}
    log_bundle        null, or the latest logs the node agent captured for the incident, when
                      healer quarantined the node ("capture") or before a reboot:
                      {"action", "captured_at", "text"} (kernel log since boot, Xid lines,
                      nvidia-smi -q; at most 256 KiB)
    log_bundle_note   null, or why ``log_bundle`` is null though a capture was asked: "the node
                      agent did not answer the log capture asked at <time>", or "the node agent
                      <refused|failed> the log capture: <reason>"
    escalated         bool
    escalation        {"escalated", "window_days", "reason", "previous": [{"kind": "node"|"gpu",
                       "gpu", "incident_id", "node", "closed_at", "close_reason"}]}
    domain            null, or for a domain's ticket (docs/topology.md): {"id", "kind", "name",
                      "size", "nodes": [member node names], "first_seen", "opened_at", "url"};
                      ``node`` and ``incident`` are then its first member's

Everything in it is JSON-safe; label values are untrusted text (templates use ``tojson``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.engine.labels import gpu_index
from healer.model.repair import decode_bundle
from healer.model.states import ActionStatus
from healer.store.models import Action, DomainIncident, Gpu, Incident, Node, Ticket, Transition
from healer.store.models import Finding as FindingRow
from healer.tickets.templates import PAYLOAD_VERSION

_SEVERITY_RANK = {"critical": 3, "error": 3, "warning": 2, "info": 1}


def _gpu_refs(findings: list[dict[str, Any]]) -> list[tuple[str | None, str | None, dict[str, Any]]]:
    """(uuid, index, finding) for each finding that names a GPU."""
    refs = []
    for f in findings:
        labels = f.get("labels") or {}
        gpu = f.get("gpu")
        uuid = labels.get("UUID") or (gpu if gpu and not str(gpu).isdigit() else None)
        index = labels.get("gpu") or (str(gpu) if gpu is not None and str(gpu).isdigit() else None)
        if uuid or index is not None:
            refs.append((uuid, index, f))
    return refs


def gpu_uuids(findings: list[dict[str, Any]]) -> set[str]:
    """UUIDs of the GPUs the findings name."""
    return {uuid for uuid, _, _ in _gpu_refs(findings) if uuid}


def implicated_gpus(session: Session, node: Node, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs named by ``findings``: ``[{"uuid", "index", "pci_bus_id", "model", "rules"}]``.

    Facts come from the ``gpus`` table (by UUID, else by the node's GPU index) and fall back to the
    finding's dcgm-exporter labels.
    """
    refs = _gpu_refs(findings)
    uuids = {u for u, _, _ in refs if u}
    by_uuid = {g.uuid: g for g in session.scalars(select(Gpu).where(Gpu.uuid.in_(uuids)))} if uuids else {}
    by_index = {str(g.index): g for g in session.scalars(select(Gpu).where(Gpu.node_id == node.id))}
    out: dict[str, dict[str, Any]] = {}
    for uuid, index, f in refs:
        row = by_uuid.get(uuid) if uuid else None
        if row is None and index is not None:
            row = by_index.get(index)
        labels = f.get("labels") or {}
        entry: dict[str, Any] = {
            "uuid": row.uuid if row else uuid,
            "index": row.index if row else (gpu_index(index) if gpu_index(index) is not None else index),
            "pci_bus_id": (row.pci_bus_id if row else None) or labels.get("pci_bus_id"),
            "model": (row.model_name if row else None) or labels.get("modelName"),
            "rules": [],
        }
        key = str(entry["uuid"] or f"index:{entry['index']}")
        entry = out.setdefault(key, entry)
        if f["rule"] not in entry["rules"]:
            entry["rules"].append(f["rule"])
    return sorted(out.values(), key=lambda g: (str(g["index"]), str(g["uuid"])))


def repeat_offences(
    session: Session, *, ticket: Ticket, uuids: set[str], since: datetime
) -> list[dict[str, Any]]:
    """Earlier incidents closed at or after ``since`` on the ticket's node, or naming one of ``uuids``.

    Shape: ``[{"kind": "node"|"gpu", "gpu", "incident_id", "node", "closed_at", "close_reason"}]``,
    newest first. The ticket's own incident is excluded. A GPU is matched by UUID wherever it was
    (recorded findings, and the findings listed by earlier tickets), so a GPU moved to another node
    is still recognised.
    """
    closed = (Incident.closed_at.is_not(None), Incident.closed_at >= since, Incident.id != ticket.incident_id)
    seen: dict[tuple[str, int, str | None], dict[str, Any]] = {}

    def add(kind: str, gpu: str | None, incident: Incident, node_name: str) -> None:
        assert incident.closed_at is not None
        seen.setdefault(
            (kind, incident.id, gpu),
            {
                "kind": kind,
                "gpu": gpu,
                "incident_id": incident.id,
                "node": node_name,
                "closed_at": incident.closed_at.isoformat(),
                "close_reason": incident.close_reason,
            },
        )

    node_rows = session.execute(
        select(Incident, Node.name)
        .join(Node, Node.id == Incident.node_id)
        .where(Incident.node_id == ticket.node_id, *closed)
    )
    for incident, node_name in node_rows:
        add("node", None, incident, node_name)
    if uuids:
        gpu_rows = session.execute(
            select(FindingRow.gpu, Incident, Node.name)
            .join(Incident, Incident.id == FindingRow.incident_id)
            .join(Node, Node.id == Incident.node_id)
            .where(FindingRow.gpu.in_(uuids), *closed)
        )
        for gpu, incident, node_name in gpu_rows:
            add("gpu", gpu, incident, node_name)
        ticket_rows = session.execute(
            select(Ticket.findings, Incident, Node.name)
            .join(Incident, Incident.id == Ticket.incident_id)
            .join(Node, Node.id == Incident.node_id)
            .where(*closed)
        )
        for findings, incident, node_name in ticket_rows:
            for uuid in sorted(gpu_uuids(findings or []) & uuids):
                add("gpu", uuid, incident, node_name)
    return sorted(seen.values(), key=lambda p: (p["closed_at"], p["incident_id"]), reverse=True)


def decide_escalation(
    session: Session, *, ticket: Ticket, window_days: int, findings: list[dict[str, Any]]
) -> dict[str, Any]:
    """Whether the ticket escalates: its node or one of its GPUs had an incident closed within
    ``window_days`` (days) before the ticket was requested. ``window_days`` 0 turns it off.

    Returns the ``escalation`` dict of the context (see the module docstring).
    """
    previous: list[dict[str, Any]] = []
    if window_days > 0:
        since = ticket.created_at - timedelta(days=window_days)
        previous = repeat_offences(session, ticket=ticket, uuids=gpu_uuids(findings), since=since)
    reasons = []
    for p in previous:
        what = f"GPU {p['gpu']}" if p["kind"] == "gpu" else f"node {p['node']}"
        reasons.append(f"{what} had incident {p['incident_id']} closed at {p['closed_at']}")
    return {
        "escalated": bool(previous),
        "window_days": window_days,
        "reason": "; ".join(reasons) + f" (within {window_days} days)" if reasons else "",
        "previous": previous,
    }


def blocked_drain(session: Session, incident: Incident) -> dict[str, Any] | None:
    """The incident's blocked drain, from its drain action row: the pods still there, the
    PodDisruptionBudgets that hold them and pods kubectl would refuse; None when not blocked."""
    row = session.scalar(
        select(Action)
        .where(
            Action.incident_id == incident.id, Action.kind == "drain", Action.status == ActionStatus.BLOCKED
        )
        .order_by(Action.id.desc())
        .limit(1)
    )
    if row is None:
        return None
    detail = row.detail or {}
    return {
        "blocked_pods": list(detail.get("blocked_pods") or []),
        "budgets": list(detail.get("budgets") or []),
        "refused": dict(detail.get("refused") or {}),
    }


def log_bundle(session: Session, incident: Incident) -> dict[str, Any] | None:
    """The latest log bundle the node agent captured for this incident (at quarantine, or before
    a reboot or other repair), as ``{"action", "captured_at", "text"}``; None when it captured
    none. The text is at most 256 KiB (healer.nodeagent.bundle caps it)."""
    rows = session.scalars(
        select(Transition)
        .where(Transition.incident_id == incident.id)
        .order_by(Transition.at.desc(), Transition.id.desc())
    )
    for row in rows:
        repair = (row.evidence or {}).get("repair")
        if not isinstance(repair, dict) or not repair.get("log_bundle"):
            continue
        try:
            text = decode_bundle(str(repair["log_bundle"]))
        except ValueError as exc:
            text = f"(the bundle kept for this repair cannot be read: {exc})"
        return {"action": repair.get("action"), "captured_at": repair.get("at"), "text": text}
    return None


def log_bundle_note(incident: Incident, bundle: dict[str, Any] | None) -> str | None:
    """Why the ticket goes without a log bundle though one was asked of the node agent (the
    incident's ``capture``); None when it has one or none was asked."""
    capture = incident.capture or {}
    if bundle is not None or not capture:
        return None
    status = capture.get("status")
    if status == "requested":
        return f"the node agent did not answer the log capture asked at {capture.get('requested_at')}"
    if status == "succeeded":
        return "the node agent captured no log bundle"
    if status == "superseded":
        return f"the node agent answered a repair instead of the log capture ({capture.get('reason')})"
    return f"the node agent {status} the log capture: {capture.get('reason') or 'no reason given'}"


def build_context(
    session: Session,
    *,
    ticket: Ticket,
    cluster: str,
    dashboard_url: str,
    idempotency_key: str,
    escalation: dict[str, Any],
) -> dict[str, Any]:
    """The render context for ``ticket`` (shape in the module docstring)."""
    node = session.get(Node, ticket.node_id)
    incident = session.get(Incident, ticket.incident_id)
    assert node is not None and incident is not None  # foreign keys with ON DELETE CASCADE
    findings = [{k: v for k, v in f.items() if k != "series_key"} for f in ticket.findings or []]
    rules = sorted({f["rule"] for f in findings})
    base = dashboard_url.rstrip("/")
    severity = max(
        (f.get("severity") or "critical" for f in findings),
        key=lambda s: _SEVERITY_RANK.get(s, 0),
        default="critical",
    )
    gpus = implicated_gpus(session, node, ticket.findings or [])
    title = f"[{cluster}] GPU node {node.name} needs repair: {', '.join(rules) or 'unhealthy'}"
    if escalation.get("escalated"):
        title = "REPEAT " + title
    lines = [f"{f['rule']}: {f['summary']}" if f.get("summary") else f["rule"] for f in findings]
    domain = _domain(session, ticket, base)
    if domain is not None:
        title = (
            f"[{cluster}] {domain['kind']} {domain['name']}: {len(domain['nodes'])} of "
            f"{domain['size']} node(s) failing together ({', '.join(rules) or 'unhealthy'})"
        )
        lines.insert(0, f"nodes: {', '.join(domain['nodes'])}")
    bundle = log_bundle(session, incident)
    drain = blocked_drain(session, incident)
    if drain is not None:
        lines.append(
            "drain blocked: pods "
            + (", ".join([*drain["blocked_pods"], *drain["refused"]]) or "(none named)")
            + "; PodDisruptionBudgets "
            + (", ".join(drain["budgets"]) or "(none named)")
        )
    return {
        "version": PAYLOAD_VERSION,
        "idempotency_key": idempotency_key,
        "cluster": cluster,
        "provider": ticket.provider,
        "ticket_id": ticket.id,
        "callback_url": f"{base}/api/v1/tickets/{ticket.id}/status",
        "dashboard_url": domain["url"] if domain else f"{base}/nodes/{node.name}",
        "created_at": ticket.created_at.isoformat(),
        "title": title,
        "summary": "\n".join(lines),
        "severity": severity,
        "node": {
            "name": node.name,
            "pool": node.pool,
            "state": node.state,
            "url": f"{base}/nodes/{node.name}",
        },
        "incident": {
            "id": incident.id,
            "opened_at": incident.opened_at.isoformat(),
            "summary": incident.summary,
        },
        "gpus": gpus,
        "findings": findings,
        "rules": rules,
        "drain": drain,
        "log_bundle": bundle,
        "log_bundle_note": log_bundle_note(incident, bundle),
        "escalated": bool(escalation.get("escalated")),
        "escalation": escalation,
        "domain": domain,
    }


def _domain(session: Session, ticket: Ticket, base: str) -> dict[str, Any] | None:
    """The ``domain`` of a domain's ticket (shape in the module docstring); None for a node's."""
    if ticket.domain_incident_id is None:
        return None
    row = session.get(DomainIncident, ticket.domain_incident_id)
    if row is None:
        return None
    return {
        "id": row.id,
        "kind": row.kind,
        "name": row.name,
        "size": row.size,
        "nodes": sorted(str(m["node"]) for m in row.members),
        "first_seen": row.first_seen.isoformat(),
        "opened_at": row.opened_at.isoformat(),
        "url": f"{base}/domains/{row.id}",
    }
