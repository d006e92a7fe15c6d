"""``healer node|pause|resume|breaker`` against a real SQLite database, as an operator types them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from healer.cli import app
from healer.model.states import NodeState
from healer.store import nodes as repo
from healer.store.models import Action, Ticket
from healer.store.session import make_engine, make_sessionmaker, transaction

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def db(migrated_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    url = migrated_sqlite_url
    monkeypatch.setenv("HEALER_DATABASE__URL", url)
    monkeypatch.setenv("USER", "alice")
    return url


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_node_list_and_release(db: str) -> None:
    sessions = make_sessionmaker(make_engine(db))
    with transaction(sessions) as s:
        node = repo.get_or_create_node(s, "gpu-07", now=T0, pool="a100")
        repo.ensure_incident(s, node, now=T0, summary="hot")
        repo.transition(s, node, NodeState.AWAITING_REPAIR, now=T0, actor="healer", reason="drained")
        repo.get_or_create_node(s, "gpu-08", now=T0)

    code, out = run("node", "list")
    assert code == 0
    assert "gpu-07" in out and "awaiting_repair" in out and "gpu-08" not in out

    code, out = run("node", "release", "gpu-07", "--reason", "GPU 3 replaced")
    assert code == 0 and "gpu-07: release requested" in out
    with sessions() as s:
        row = s.scalars(select(Action).where(Action.kind == "release")).one()
        assert (row.actor, row.detail) == ("cli:alice", {"reason": "GPU 3 replaced"})

    code, out = run("node", "release", "gpu-08")
    assert code == 1 and "only" in out


def test_pause_resume_and_breaker(db: str) -> None:
    assert run("pause", "--reason", "cluster upgrade") == (0, "healer paused: cluster upgrade\n")
    sessions = make_sessionmaker(make_engine(db))
    with sessions() as s:
        assert repo.get_switch(s, repo.SWITCH_PAUSED) == {"paused": True, "reason": "cluster upgrade"}
    assert run("resume") == (0, "healer resumed\n")
    assert run("resume") == (0, "healer was not paused (recorded all the same)\n")

    code, out = run("breaker", "status")
    assert code == 0 and "not tripped" in out
    code, out = run("breaker", "reset")
    assert code == 1 and "not tripped" in out

    with transaction(sessions) as s:
        value = {
            "tripped": True,
            "reason": "80 node(s)",
            "tripped_at": T0.isoformat(),
            "held": ["gpu-1", "gpu-2"],
        }
        repo.set_switch(s, repo.SWITCH_BREAKER, value, now=T0, by="healer")
    code, out = run("breaker", "status")
    assert code == 0 and "TRIPPED" in out and "holding back 2 node(s): gpu-1, gpu-2" in out
    code, out = run("breaker", "reset")
    assert code == 0 and "2 held node(s)" in out
    with sessions() as s:
        assert repo.get_switch(s, repo.SWITCH_BREAKER)["reset_by"] == "cli:alice"


def test_node_list_says_what_it_knows_and_mentions_a_pause(db: str) -> None:
    assert run("node", "list") == (0, "no nodes recorded yet (has `healer run` run against this database?)\n")
    sessions = make_sessionmaker(make_engine(db))
    with transaction(sessions) as s:
        repo.get_or_create_node(s, "gpu-08", now=T0)
    assert run("node", "list") == (0, "all 1 recorded node(s) are healthy\n")
    run("pause", "--reason", "cluster upgrade")
    code, out = run("node", "list")
    assert code == 0
    assert out.splitlines()[0].startswith("healer is PAUSED: cluster upgrade (no new quarantine")
    assert out.splitlines()[1] == "all 1 recorded node(s) are healthy"


def test_ticket_stats_says_no_tickets_then_aligns_its_columns(db: str) -> None:
    assert run("ticket", "stats") == (0, "no tickets\n")
    sessions = make_sessionmaker(make_engine(db))
    with transaction(sessions) as s:
        node = repo.get_or_create_node(s, "gpu-07", now=T0)
        incident = repo.ensure_incident(s, node, now=T0, summary="hot")
        s.add(
            Ticket(
                incident_id=incident.id,
                node_id=node.id,
                provider="acme-cloud",
                idempotency_key="k-1",
                status="pending",
                created_at=T0,
                updated_at=T0,
            )
        )
    code, out = run("ticket", "stats")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["PROVIDER", "OPEN", "TOTAL", "FAILED", "MEDIAN", "ACK", "MEDIAN", "REPAIR"]
    assert row.split()[0] == "acme-cloud"
    # every value starts under its header
    for title in ("OPEN", "TOTAL", "FAILED", "MEDIAN ACK", "MEDIAN REPAIR"):
        assert row[header.index(title)] != " ", (title, out)
