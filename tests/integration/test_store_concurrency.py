"""Concurrency on a real PostgreSQL: duplicate provider callbacks at the same moment, and replicas
running ``healer db upgrade`` at once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import func, inspect, select, text
from sqlalchemy.orm import Session, sessionmaker

from healer.model.states import NodeState, TicketStatus
from healer.store import migrate
from healer.store import nodes as repo
from healer.store.models import Action, Base, Node, Switch, Ticket, Transition
from healer.store.session import make_engine, make_sessionmaker, transaction
from healer.tickets import service
from tests.integration.test_ticket_callbacks import sent_ticket
from tests.integration.test_ticket_delivery import NOW
from tests.services import PostgresServer, wait_until

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = postgres.create_database(name)
    yield url
    postgres.drop_database(name)


@pytest.fixture
def pg_sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    migrate.upgrade(pg_url)
    engine = make_engine(pg_url, pool_size=10)
    yield make_sessionmaker(engine)
    engine.dispose()


def test_duplicate_callbacks_at_the_same_moment_are_applied_once(pg_sessions: sessionmaker[Session]) -> None:
    ticket_id = sent_ticket(pg_sessions)
    with transaction(pg_sessions) as s:
        ticket = s.get(Ticket, ticket_id)
        assert ticket is not None
        node = s.get(Node, ticket.node_id)
        assert node is not None
        node.state = NodeState.AWAITING_REPAIR
    copies = 6
    start = threading.Barrier(copies)
    changes: list[service.StatusChange] = []
    failures: list[BaseException] = []

    def deliver(i: int) -> None:
        try:
            start.wait(timeout=30)
            with transaction(pg_sessions) as s:
                change = service.apply_provider_status(
                    s,
                    ticket_id=ticket_id,
                    status=TicketStatus.RESOLVED,
                    now=NOW + timedelta(milliseconds=i),
                    external_id="ACME-1",
                )
            changes.append(change)
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(copies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert failures == []
    assert sorted(c.changed for c in changes) == [False] * (copies - 1) + [True]
    with pg_sessions() as s:
        audit = s.scalars(select(Action).where(Action.kind == "ticket_status")).all()
        moves = s.execute(select(Transition.from_state, Transition.to_state).order_by(Transition.id)).all()
        node_state = s.scalar(select(Node.state))
    assert len(audit) == 1
    # The callbacks record the ticket only: the node moves by the controller's next reconcile.
    assert "validating" not in [m[1] for m in moves]
    assert node_state == NodeState.AWAITING_REPAIR


def _advisory_waiters(pg_url: str) -> int:
    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()
    return int(row[0]) if row else 0


def test_two_replicas_upgrading_at_once_both_succeed(pg_url: str) -> None:
    env = {**os.environ, "HEALER_DATABASE__URL": pg_url}
    cmd = [sys.executable, "-m", "healer", "db", "upgrade"]
    # Hold the lock so both replicas are surely inside `db upgrade` together, then let them go.
    with migrate.migration_lock(pg_url):
        procs = [
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in "ab"
        ]
        try:
            wait_until(lambda: _advisory_waiters(pg_url) == 2, timeout=60, what="both replicas waiting")
        except BaseException:
            for p in procs:
                p.kill()
            raise
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert all("database at revision head" in out for out in outputs)
    engine = make_engine(pg_url)
    try:
        assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(Base.metadata.tables["nodes"])) == 0
    finally:
        engine.dispose()


def test_two_replicas_recording_their_rule_set_at_once_both_go_on(pg_sessions: sessionmaker[Session]) -> None:
    """Two replicas start together; both read no ``ruleset`` row and both write one. The second
    write waits on the first replica's transaction and then replaces its row: neither fails on
    the primary key (a read-then-INSERT did, and that replica exited)."""
    first, second = pg_sessions(), pg_sessions()
    try:
        assert repo.get_switch(first, repo.SWITCH_RULESET) == {}
        assert repo.get_switch(second, repo.SWITCH_RULESET) == {}
        repo.set_switch(first, repo.SWITCH_RULESET, {"rules": 1}, now=NOW, by="healer-a")
        failures: list[BaseException] = []

        def write_second() -> None:
            try:
                repo.set_switch(second, repo.SWITCH_RULESET, {"rules": 2}, now=NOW, by="healer-b")
                second.commit()
            except BaseException as exc:  # reported by the assertion below
                failures.append(exc)

        writer = threading.Thread(target=write_second)
        writer.start()
        wait_until(lambda: _lock_waiters(pg_sessions) == 1, timeout=30, what="the second write waiting")
        first.commit()
        writer.join(timeout=30)
        assert not writer.is_alive() and failures == []
    finally:
        first.close()
        second.close()
    with transaction(pg_sessions) as s:
        assert repo.get_switch(s, repo.SWITCH_RULESET) == {"rules": 2}
        assert s.get(Switch, repo.SWITCH_RULESET).updated_by == "healer-b"  # type: ignore[union-attr]


def _lock_waiters(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        waiting = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return int(s.scalar(text(waiting)) or 0)
