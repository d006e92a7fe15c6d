"""The parts ledger counts failures per part and incident (healer.store.parts), on both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from healer.model.states import NodeState
from healer.store import nodes as repo
from healer.store.parts import ledger

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
UUID = "GPU-32b5cede-0000-4000-8000-000000000005"


def test_two_rules_on_one_gpu_in_one_incident_are_one_failure(session_factory: sessionmaker[Session]) -> None:
    """GpuFatalXid and GpuFatalXidRecent both fire on the GPU of an Xid 79: the Parts page shows one
    failure, no time between failures, and the part is not a repeat offender."""
    both = {
        "findings": [
            {"rule": "GpuFatalXid", "labels": {"UUID": UUID, "gpu": "5"}},
            {"rule": "GpuFatalXidRecent", "labels": {"UUID": UUID, "gpu": "5", "xid": "79"}},
        ]
    }
    with session_factory() as s, s.begin():
        node = repo.get_or_create_node(s, "gpu-node-12", now=NOW - timedelta(days=1), pool="h100")
        repo.ensure_incident(s, node, now=NOW, summary="GpuFatalXid firing")
        repo.transition(
            s, node, NodeState.QUARANTINED, now=NOW, actor="healer", reason="Xid 79", evidence=both
        )
    with session_factory() as s:
        found = ledger(s, since=NOW - timedelta(days=1))
    (part,) = found.parts
    assert part.id == UUID and len(part.failures) == 1
    assert part.mean_time_between_failures_seconds is None and not part.repeat
