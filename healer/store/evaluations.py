"""Repository for what detection learns each tick: rule evaluations, finding episodes, GPUs.

Never commits: every function takes the caller's ``Session`` (the tick owns the transaction).
Writes are bounded: one ``rule_evaluations`` row per rule per tick; one ``findings`` row per
episode (inserted when it turns pending, or firing at once), updated when it fires or resolves,
and its value/last-seen refreshed at most once per tick while it is active; one ``gpus`` row per
GPU UUID seen in a finding's labels. :func:`load_state` rebuilds the evaluation state from the
open episodes so a restarted controller resumes its ``for`` timers.

Label values arrive cleaned by the engine (:mod:`healer.engine.labels`); text bound for a
bounded column is clipped here, and a GPU index that is not a small decimal number records no GPU.

Values: NaN is stored as NULL (SQLite cannot store NaN; PostgreSQL could, but both backends
must read back the same); ±Inf are stored as is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from healer.engine.evaluation import ChangeKind, EvaluationState, FindingChange, RuleReport
from healer.engine.labels import clip, gpu_index
from healer.model.findings import Finding as FindingShape
from healer.model.states import FindingState
from healer.store.models import Finding, Gpu, Node, RuleEvaluation
from healer.store.nodes import get_or_create_node

#: Episode states still open (a resolved row is history).
OPEN_STATES = (str(FindingState.PENDING), str(FindingState.FIRING))
#: Rows per ``IN (...)`` list: well under SQLite's bound-parameter limit.
_CHUNK = 500
#: dcgm-exporter's GPU identity labels (reference/metrics.md).
GPU_UUID, GPU_INDEX, GPU_PCI_BUS_ID, GPU_MODEL = "UUID", "gpu", "pci_bus_id", "modelName"

_T = TypeVar("_T")


def record_reports(session: Session, reports: Sequence[RuleReport]) -> None:
    """One ``rule_evaluations`` row per report: health, error, duration (seconds), series and
    firing counts; ``warnings`` holds the source's warnings and, when some series named no node,
    that count with an example label set, which is also the ``error`` of a ``degraded`` rule (the
    Rules page shows it under the health)."""
    rows = []
    for report in reports:
        warnings = list(report.warnings)
        if report.unresolved is not None:
            warnings.append(str(report.unresolved))
        rows.append(
            {
                "rule": report.rule,
                "group": report.group,
                "evaluated_at": report.evaluated_at,
                "duration_seconds": report.duration_seconds,
                "health": str(report.health),
                "error": report.error or (str(report.unresolved) if report.unresolved else None),
                "series": report.series,
                "firing": report.firing,
                "warnings": warnings or None,
            }
        )
    if rows:
        session.execute(insert(RuleEvaluation), rows)


def record_changes(session: Session, changes: Sequence[FindingChange], *, now: datetime) -> None:
    """Apply one tick's episode changes to the ``findings`` table, create the nodes they name,
    and record the GPUs their labels identify.

    - ``pending``: insert a row; ``fired``: update the open row (insert when there is none,
      e.g. ``for: 0``); ``updated``: refresh value, summary and ``last_seen_at``;
      ``resolved``/``dropped``: set ``state=resolved`` and ``resolved_at``.
    - An open row is matched by series key; a change for a key with no open row that closes an
      episode is ignored (nothing to close).
    """
    if not changes:
        return
    open_ids = _open_ids(session, {c.finding.series_key for c in changes})
    inserts: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    for change in changes:
        f = change.finding
        row_id = open_ids.get(f.series_key)
        if change.kind in (ChangeKind.RESOLVED, ChangeKind.DROPPED):
            if row_id is not None:
                updates.append(
                    {"id": row_id, "state": str(FindingState.RESOLVED), "resolved_at": f.resolved_at}
                )
            continue
        if row_id is None:
            inserts.append(_row(f, now))
        elif change.kind == ChangeKind.FIRED:
            updates.append({"id": row_id, **_refresh(f), "state": str(f.state), "fired_at": f.fired_at})
        else:
            updates.append({"id": row_id, **_refresh(f)})
    active = [c.finding for c in changes if c.kind not in (ChangeKind.RESOLVED, ChangeKind.DROPPED)]
    nodes = _ensure_nodes(session, {f.node for f in active}, now=now)
    if inserts:
        session.execute(insert(Finding), inserts)
    if updates:
        session.execute(update(Finding), updates)
    _record_gpus(session, active, nodes, now=now)


def load_state(session: Session) -> EvaluationState:
    """The evaluation state held in the open (pending or firing) episodes.

    ``for`` timers resume from ``active_since``; a recovery hold in progress at shutdown starts
    again at the first clear tick after start-up (longer, never shorter).
    """
    rows = session.scalars(
        select(Finding).where(Finding.state.in_(OPEN_STATES)).order_by(Finding.active_since, Finding.id)
    )
    return EvaluationState(series={row.series_key: finding_from_row(row) for row in rows})


def finding_from_row(row: Finding) -> FindingShape:
    """The engine's :class:`~healer.model.findings.Finding` for a ``findings`` row."""
    return FindingShape(
        rule=row.rule,
        series_key=row.series_key,
        node=row.node_name,
        gpu=row.gpu,
        state=FindingState(row.state),
        severity=row.severity,
        value=row.value,
        unit=row.unit,
        labels={str(k): str(v) for k, v in (row.labels or {}).items()},
        summary=row.summary,
        active_since=row.active_since,
        fired_at=row.fired_at,
        last_true_at=row.last_seen_at,
        resolved_at=row.resolved_at,
    )


def open_findings(session: Session, *, node: str | None = None) -> list[Finding]:
    """Open episodes (pending or firing), oldest first; only ``node``'s when given."""
    query = select(Finding).where(Finding.state.in_(OPEN_STATES))
    if node is not None:
        query = query.where(Finding.node_name == node)
    return list(session.scalars(query.order_by(Finding.active_since, Finding.id)))


def latest_reports(session: Session, *, limit: int = 1000) -> list[RuleEvaluation]:
    """Each rule's most recent evaluation row (rule name order)."""
    newest = select(func.max(RuleEvaluation.evaluated_at)).scalar_subquery()
    return list(
        session.scalars(
            select(RuleEvaluation)
            .where(RuleEvaluation.evaluated_at == newest)
            .order_by(RuleEvaluation.rule)
            .limit(limit)
        )
    )


# --- helpers ----------------------------------------------------------------------------------


def _chunks(items: Iterable[_T]) -> Iterator[list[_T]]:
    batch: list[_T] = []
    for item in items:
        batch.append(item)
        if len(batch) == _CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def _open_ids(session: Session, keys: set[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for batch in _chunks(sorted(keys)):
        rows = session.execute(
            select(Finding.series_key, Finding.id)
            .where(Finding.series_key.in_(batch), Finding.state.in_(OPEN_STATES))
            .order_by(Finding.id)
        )
        for key, row_id in rows:
            found[key] = row_id  # the newest open row wins if there ever were two
    return found


def _value(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def _refresh(f: FindingShape) -> dict[str, Any]:
    return {"value": _value(f.value), "summary": f.summary, "last_seen_at": f.last_true_at}


def _row(f: FindingShape, now: datetime) -> dict[str, Any]:
    return {
        "rule": f.rule,
        "series_key": f.series_key,
        "node_name": clip(f.node, 253),
        "gpu": clip(f.gpu, 64),
        "state": str(f.state),
        "severity": f.severity,
        "value": _value(f.value),
        "unit": f.unit,
        "labels": dict(f.labels),
        "summary": f.summary,
        "active_since": f.active_since or now,
        "fired_at": f.fired_at,
        "resolved_at": None,
        "last_seen_at": f.last_true_at or now,
    }


def _ensure_nodes(session: Session, names: set[str], *, now: datetime) -> dict[str, Node]:
    nodes: dict[str, Node] = {}
    for batch in _chunks(sorted(names)):
        for node in session.scalars(select(Node).where(Node.name.in_(batch))):
            nodes[node.name] = node
    for name in sorted(names - nodes.keys()):
        nodes[name] = get_or_create_node(session, name, now=now)
    return nodes


def _record_gpus(
    session: Session, findings: Sequence[FindingShape], nodes: dict[str, Node], *, now: datetime
) -> None:
    """Upsert ``gpus`` rows from labels that carry a UUID and a numeric index."""
    seen: dict[str, dict[str, Any]] = {}
    for f in findings:
        uuid = f.labels.get(GPU_UUID)
        index = gpu_index(f.labels.get(GPU_INDEX))
        if not uuid or len(uuid) > 64 or index is None or f.node not in nodes:
            continue  # not a GPU UUID (they are GPU-<36 hex and dashes>) or not a GPU index
        seen[uuid] = {
            "node_id": nodes[f.node].id,
            "index": index,
            "pci_bus_id": clip(f.labels.get(GPU_PCI_BUS_ID) or None, 32),
            "model_name": clip(f.labels.get(GPU_MODEL) or None, 128),
            "last_seen": now,
        }
    if not seen:
        return
    existing: dict[str, int] = {}
    for batch in _chunks(sorted(seen)):
        existing.update(
            {u: i for u, i in session.execute(select(Gpu.uuid, Gpu.id).where(Gpu.uuid.in_(batch)))}
        )
    new = [{"uuid": u, "first_seen": now, **v} for u, v in seen.items() if u not in existing]
    changed = [{"id": existing[u], **v} for u, v in seen.items() if u in existing]
    if new:
        session.execute(insert(Gpu), new)
    if changed:
        session.execute(update(Gpu), changed)
