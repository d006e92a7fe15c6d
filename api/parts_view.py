"""What the dashboard shows of the parts ledger (:mod:`healer.store.parts`): the Parts page, and the
flag on a node page whose node holds a part that failed before.

A node holds a part when the part is in its GPU inventory (``gpus``, by UUID) or its latest failure
was on that node (the only tie an HCA has, and a GPU's when no inventory is recorded). The flag
names parts that failed before and were repaired (their incident reached ``repaired``), and marks
the repeat offenders: parts that failed again after such a repair, on any node, which the lifecycle
sends straight to replacement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from healer.store import parts
from healer.store.models import Gpu, Incident, Node
from healer.store.parts import PartRecord, StepOutcomes

#: The most parts listed on the Parts page (repeat offenders first); the rest are in /api/v1/parts.
MAX_PARTS_SHOWN = 200


@dataclass(frozen=True)
class NodeFailures:
    """One node's failures in the window and the mean time between them, seconds (None with one)."""

    node: str
    failures: int
    mean_seconds: float | None


@dataclass(frozen=True)
class PartsPage:
    """The Parts page: the window (days), parts (repeat offenders first, at most
    :data:`MAX_PARTS_SHOWN`), repair outcomes per step and provider, and failures per node."""

    days: int
    parts: list[PartRecord]
    total_parts: int
    repeat_count: int
    steps: list[StepOutcomes]
    nodes: list[NodeFailures]


def parts_page(session: Session, *, now: datetime, days: int) -> PartsPage:
    """The ledger of incidents opened in the last ``days`` days, arranged for the page."""
    book = parts.ledger(session, since=now - timedelta(days=days))
    mtbf = book.node_mtbf()
    nodes = [NodeFailures(node, len(times), mtbf.get(node)) for node, times in book.node_failures.items()]
    # Most failures first; among equals the shortest time between them first.
    nodes.sort(
        key=lambda n: (-n.failures, n.mean_seconds if n.mean_seconds is not None else float("inf"), n.node)
    )
    return PartsPage(
        days=days,
        parts=book.parts[:MAX_PARTS_SHOWN],
        total_parts=len(book.parts),
        repeat_count=sum(1 for p in book.parts if p.repeat),
        steps=book.steps,
        nodes=nodes,
    )


def parts_failed_before(session: Session, node: str, *, now: datetime) -> list[PartRecord]:
    """Parts the node holds that failed before and were repaired, or failed again after a repair
    (repeat offenders first), over :data:`healer.store.parts.DEFAULT_WINDOW`. The node's own open
    incident does not count as "before": a part repaired in it and still being validated is the
    story the page tells below, not an earlier failure."""
    book = parts.ledger(session, since=now - parts.DEFAULT_WINDOW)
    held = set(session.scalars(select(Gpu.uuid).join(Node, Node.id == Gpu.node_id).where(Node.name == node)))
    current = set(
        session.scalars(
            select(Incident.id)
            .join(Node, Node.id == Incident.node_id)
            .where(Node.name == node, Incident.closed_at.is_(None))
        )
    )
    out = []
    for part in book.parts:
        here = (part.kind == "gpu" and part.id in held) or (part.failures and part.failures[-1][1] == node)
        if here and (part.repeat or part.repaired_incidents - current):
            out.append(part)
    return out
