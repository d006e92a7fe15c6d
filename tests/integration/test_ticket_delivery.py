"""Ticket outbox and delivery against a real HTTP receiver on loopback, on SQLite and PostgreSQL.

Time is passed in as ``now`` and advanced by hand; nothing sleeps for a backoff.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from healer.config import Settings, load_settings
from healer.model.findings import Finding
from healer.model.states import FindingState, NodeState, OutboxStatus, TicketStatus
from healer.store import nodes as repo
from healer.store.models import Action, Gpu, Incident, Node, OutboxMessage, Ticket
from healer.store.models import Finding as FindingRow
from healer.store.session import make_engine, make_sessionmaker
from healer.tickets import delivery, service
from healer.tickets.delivery import DeliveryReport, deliver_due
from healer.tickets.outbox import request_ticket
from healer_dev.provider import Receiver
from tests.services import free_port

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SECRET = "acme-webhook-secret-0123456789"
UUID = "GPU-5fa1c0de-1111-2222-3333-444455556666"


def finding(
    rule: str = "GpuXidErrors", *, gpu: str | None = UUID, value: float = 79.0, **labels: str
) -> Finding:
    base = {"UUID": gpu or "", "gpu": "3", "pci_bus_id": "00000000:3B:00.0", "modelName": "NVIDIA A100"}
    return Finding(
        rule=rule,
        series_key=f"{rule}|{gpu}",
        node="gpu-node-1",
        gpu=gpu,
        state=FindingState.FIRING,
        severity="critical",
        value=value,
        unit="xid" if "Xid" in rule else "C",
        labels={**base, **labels} if gpu else dict(labels),
        summary=f"{rule} on GPU 3",
        active_since=NOW - timedelta(minutes=10),
        fired_at=NOW - timedelta(minutes=5),
    )


def seed_node(session: Session, name: str = "gpu-node-1", *, when: datetime = NOW) -> tuple[Node, Incident]:
    node = repo.get_or_create_node(session, name, now=when - timedelta(days=90), pool="a100")
    if not node.gpus:
        session.add(
            Gpu(
                uuid=UUID if name == "gpu-node-1" else f"GPU-{name}",
                node_id=node.id,
                index=3,
                pci_bus_id="00000000:3B:00.0",
                model_name="NVIDIA A100-SXM4-80GB",
                first_seen=when - timedelta(days=90),
                last_seen=when,
            )
        )
    repo.transition(session, node, NodeState.AWAITING_REPAIR, now=when, actor="healer", reason="drained")
    incident = repo.ensure_incident(session, node, now=when - timedelta(minutes=10), summary="Xid 79")
    return node, incident


def new_ticket(
    factory: sessionmaker[Session],
    *,
    findings: list[Finding] | None = None,
    provider: str = "acme",
    node_name: str = "gpu-node-1",
    template: str | None = None,
    when: datetime = NOW,
) -> int:
    with factory() as session, session.begin():
        node, incident = seed_node(session, node_name, when=when)
        ticket = request_ticket(
            session,
            incident=incident,
            node=node,
            provider=provider,
            template=template,
            findings=findings or [finding()],
            now=when,
        )
        return ticket.id


def make_settings(*providers: dict[str, Any], **tickets: Any) -> Settings:
    return load_settings(
        tickets={
            "cluster_name": "test",
            "dashboard_url": "http://dashboard.test",
            "providers": list(providers),
            **tickets,
        }
    )


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TEST_ACME_SECRET", SECRET)
    return "TEST_ACME_SECRET"


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(**kwargs: Any) -> Receiver:
        rcv = Receiver(**kwargs).start()
        started.append(rcv)
        return rcv

    yield start
    for rcv in started:
        rcv.stop()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client() as c:
        yield c


def run(
    factory: sessionmaker[Session], settings: Settings, client: httpx.Client, now: datetime
) -> DeliveryReport:
    return deliver_due(
        session_factory=factory, settings=settings, now=now, client=client, rng=random.Random(1)
    )


def _incident_id(factory: sessionmaker[Session], ticket_id: int) -> int:
    with factory() as session:
        ticket = session.get(Ticket, ticket_id)
        assert ticket is not None
        return ticket.incident_id


def get(factory: sessionmaker[Session], ticket_id: int) -> tuple[Ticket, OutboxMessage]:
    with factory() as session:
        ticket = session.get(Ticket, ticket_id)
        message = session.scalar(select(OutboxMessage).where(OutboxMessage.ticket_id == ticket_id))
        assert ticket is not None and message is not None
        return ticket, message


class TestRetries:
    def test_three_500s_then_one_delivered_ticket_same_key(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client, secret_env: str
    ) -> None:
        rcv = receivers(fail_first=3, secret=SECRET.encode())
        settings = make_settings({"name": "acme", "url": f"{rcv.url}/intake", "secret_env": secret_env})
        ticket_id = new_ticket(session_factory)

        now = NOW
        results = []
        for _ in range(4):
            report = run(session_factory, settings, client, now)
            results.append([o.result for o in report.outcomes])
            # Not due again at the same instant: a failure schedules the next attempt later.
            assert run(session_factory, settings, client, now).outcomes == []
            now += timedelta(hours=1)
        assert results == [["retry"], ["retry"], ["retry"], ["delivered"]]

        assert [r.status for r in rcv.requests] == [500, 500, 500, 201]
        keys = {r.idempotency_key for r in rcv.requests}
        assert keys == {f"healer-test-incident-{_incident_id(session_factory, ticket_id)}-acme"}
        assert {r.signature for r in rcv.requests} == {"ok"}
        assert len(rcv.tickets) == 1
        payload = rcv.requests[-1].json
        assert payload["idempotency_key"] in keys
        assert payload["ticket_id"] == ticket_id

        ticket, message = get(session_factory, ticket_id)
        assert ticket.status == TicketStatus.SENT
        assert ticket.external_id == "RCV-1"
        assert ticket.sent_at == NOW + timedelta(hours=3)
        assert ticket.last_error is None
        assert message.status == OutboxStatus.DELIVERED
        assert message.attempts == 4
        # Nothing left to send.
        assert run(session_factory, settings, client, now + timedelta(days=1)).outcomes == []
        assert len(rcv.requests) == 4

    def test_backoff_grows_with_attempts(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client
    ) -> None:
        rcv = receivers(fail_first=100)
        settings = make_settings({"name": "acme", "url": rcv.url})
        ticket_id = new_ticket(session_factory)
        now = NOW
        windows = []
        for attempt in range(1, 6):
            report = run(session_factory, settings, client, now)
            (outcome,) = report.outcomes
            assert outcome.next_attempt_at is not None
            delay = (outcome.next_attempt_at - now).total_seconds()
            windows.append(delay)
            assert 0 <= delay <= min(900, 5 * 2 ** (attempt - 1))
            now = outcome.next_attempt_at
        _, message = get(session_factory, ticket_id)
        assert message.status == OutboxStatus.PENDING and message.attempts == 5
        assert "HTTP 500" in (message.last_error or "")

    def test_retry_after_is_honoured(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client
    ) -> None:
        rcv = receivers(fail_first=1, fail_status=429, retry_after="120")
        settings = make_settings({"name": "acme", "url": rcv.url})
        ticket_id = new_ticket(session_factory)

        (first,) = run(session_factory, settings, client, NOW).outcomes
        assert (first.result, first.status_code) == ("retry", 429)
        assert first.next_attempt_at == NOW + timedelta(seconds=120)
        assert run(session_factory, settings, client, NOW + timedelta(seconds=119)).outcomes == []
        (second,) = run(session_factory, settings, client, NOW + timedelta(seconds=120)).outcomes
        assert second.result == "delivered"
        assert [r.status for r in rcv.requests] == [429, 201]
        assert get(session_factory, ticket_id)[0].status == TicketStatus.SENT

    def test_transport_error_is_retried(
        self, session_factory: sessionmaker[Session], client: httpx.Client
    ) -> None:
        settings = make_settings(
            {"name": "acme", "url": f"http://127.0.0.1:{free_port()}/x", "timeout_seconds": 2}
        )
        ticket_id = new_ticket(session_factory)
        (outcome,) = run(session_factory, settings, client, NOW).outcomes
        assert outcome.result == "retry" and outcome.status_code is None
        ticket, message = get(session_factory, ticket_id)
        assert ticket.status == TicketStatus.PENDING
        assert "ConnectError" in (message.last_error or "")

    def test_restart_between_attempts_loses_nothing(
        self, migrated_db_url: str, receivers: Any, client: httpx.Client, secret_env: str
    ) -> None:
        rcv = receivers(fail_first=1, secret=SECRET.encode())
        settings = make_settings({"name": "acme", "url": rcv.url, "secret_env": secret_env})

        engine = make_engine(migrated_db_url)
        first = make_sessionmaker(engine)
        ticket_id = new_ticket(first)
        assert [o.result for o in run(first, settings, client, NOW).outcomes] == ["retry"]
        engine.dispose()  # the controller goes away

        engine = make_engine(migrated_db_url)  # a new one (or the new leader) starts
        second = make_sessionmaker(engine)
        try:
            assert [o.result for o in run(second, settings, client, NOW + timedelta(hours=1)).outcomes] == [
                "delivered"
            ]
            ticket, message = get(second, ticket_id)
            with second() as session:
                assert session.scalar(select(func.count()).select_from(Ticket)) == 1
        finally:
            engine.dispose()
        assert ticket.status == TicketStatus.SENT and message.attempts == 2
        assert len({r.idempotency_key for r in rcv.requests}) == 1
        assert [r.status for r in rcv.requests] == [500, 201]
        assert len(rcv.tickets) == 1


class TestPermanentFailures:
    def test_400_is_permanent_and_visible(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client
    ) -> None:
        rcv = receivers(reject_status=400)
        settings = make_settings({"name": "acme", "url": rcv.url})
        ticket_id = new_ticket(session_factory)

        (outcome,) = run(session_factory, settings, client, NOW).outcomes
        assert (outcome.result, outcome.status_code) == ("failed", 400)
        ticket, message = get(session_factory, ticket_id)
        assert ticket.status == TicketStatus.FAILED
        assert message.status == OutboxStatus.FAILED
        assert "HTTP 400" in (ticket.last_error or "")
        assert "missing field 'asset_tag'" in (ticket.last_error or "")
        assert run(session_factory, settings, client, NOW + timedelta(days=1)).outcomes == []
        assert len(rcv.requests) == 1
        with session_factory() as session:
            (row,) = service.list_tickets(session)
            assert row.status == "failed" and "asset_tag" in (row.last_error or "")
            failed = session.scalars(
                select(Action).where(Action.kind == "ticket", Action.status == "failed")
            ).all()
            assert len(failed) == 1 and "HTTP 400" in (failed[0].error or "")

    def test_retry_by_hand_reuses_the_key(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client
    ) -> None:
        bad = receivers(reject_status=400)
        good = receivers()
        ticket_id = new_ticket(session_factory)
        run(session_factory, make_settings({"name": "acme", "url": bad.url}), client, NOW)
        with session_factory() as session, session.begin():
            service.retry_ticket(session, ticket_id=ticket_id, actor="cli:sre", now=NOW + timedelta(hours=1))
        later = NOW + timedelta(hours=1)
        (outcome,) = run(
            session_factory, make_settings({"name": "acme", "url": good.url}), client, later
        ).outcomes
        assert outcome.result == "delivered"
        assert bad.requests[0].idempotency_key == good.requests[0].idempotency_key

    def test_broken_template_fails_the_ticket_naming_it(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client, tmp_path: Any
    ) -> None:
        path = tmp_path / "broken.json.j2"
        path.write_text('{\n  "node": {{ node.nmae | tojson }}\n}\n')
        rcv = receivers()
        settings = make_settings(
            {"name": "acme", "url": rcv.url, "template": path.name}, templates_dir=str(tmp_path)
        )
        ticket_id = new_ticket(session_factory)
        (outcome,) = run(session_factory, settings, client, NOW).outcomes
        assert outcome.result == "failed"
        ticket, _ = get(session_factory, ticket_id)
        assert ticket.status == TicketStatus.FAILED
        assert "broken.json.j2 line 2" in (ticket.last_error or "")
        assert rcv.requests == []


class TestIdempotency:
    def test_request_twice_gives_one_ticket(self, session_factory: sessionmaker[Session]) -> None:
        first = new_ticket(session_factory)
        second = new_ticket(session_factory)
        assert first == second
        with session_factory() as session:
            assert session.scalar(select(func.count()).select_from(Ticket)) == 1
            assert session.scalar(select(func.count()).select_from(OutboxMessage)) == 1
            assert (
                session.scalar(select(func.count()).select_from(Action).where(Action.kind == "ticket")) == 1
            )

    def test_two_rules_one_ticket_listing_both(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client
    ) -> None:
        rcv = receivers()
        settings = make_settings({"name": "acme", "url": rcv.url})
        ticket_id = new_ticket(session_factory, findings=[finding("GpuXidErrors")])
        assert new_ticket(session_factory, findings=[finding("GpuTooHot", value=97.0)]) == ticket_id

        (outcome,) = run(session_factory, settings, client, NOW).outcomes
        assert outcome.result == "delivered"
        (request,) = rcv.requests
        payload = request.json
        assert sorted(f["rule"] for f in payload["findings"]) == ["GpuTooHot", "GpuXidErrors"]
        assert payload["rules"] == ["GpuTooHot", "GpuXidErrors"]
        (gpu,) = payload["gpus"]
        assert gpu == {
            "uuid": UUID,
            "index": 3,
            "pci_bus_id": "00000000:3B:00.0",
            "model": "NVIDIA A100-SXM4-80GB",
            "rules": ["GpuXidErrors", "GpuTooHot"],
        }
        assert payload["node"]["name"] == "gpu-node-1"
        assert payload["dashboard_url"] == "http://dashboard.test/nodes/gpu-node-1"
        assert payload["cluster"] == "test"
        assert payload["version"] == "1"

        # Once sent, a third rule does not resend.
        assert new_ticket(session_factory, findings=[finding("NvlinkErrors")]) == ticket_id
        assert run(session_factory, settings, client, NOW + timedelta(hours=1)).outcomes == []
        assert len(rcv.requests) == 1

    def test_two_processes_claim_a_message_once(self, session_factory: sessionmaker[Session]) -> None:
        settings = make_settings({"name": "acme", "url": "http://127.0.0.1:9/"})
        new_ticket(session_factory)
        with session_factory() as session:
            message_id, attempts = session.execute(select(OutboxMessage.id, OutboxMessage.attempts)).one()
        tickets = settings.tickets
        won = delivery._claim(session_factory, message_id, attempts, tickets=tickets, now=NOW)
        lost = delivery._claim(session_factory, message_id, attempts, tickets=tickets, now=NOW)
        assert won is not None and lost is None
        # The claim is a lease: the message is not due for another process in the meantime.
        report = run(session_factory, settings, httpx.Client(), NOW + timedelta(seconds=30))
        assert report.outcomes == [] and report.skipped_claimed == 0


class TestEscalation:
    def _closed_incident(
        self, session_factory: sessionmaker[Session], *, node_name: str, days_ago: float, gpu: str | None
    ) -> None:
        with session_factory() as session, session.begin():
            closed_at = NOW - timedelta(days=days_ago)
            node, incident = seed_node(session, node_name, when=closed_at - timedelta(hours=5))
            if gpu:
                session.add(
                    FindingRow(
                        rule="GpuXidErrors",
                        series_key="old",
                        node_name=node_name,
                        gpu=gpu,
                        state="resolved",
                        value=48.0,
                        labels={"UUID": gpu},
                        active_since=closed_at - timedelta(hours=5),
                        last_seen_at=closed_at,
                        incident_id=incident.id,
                    )
                )
            repo.close_incident(session, node, now=closed_at, reason="repaired")
            repo.transition(
                session, node, NodeState.HEALTHY, now=closed_at, actor="healer", reason="validated"
            )

    def test_node_repaired_recently_escalates(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client
    ) -> None:
        normal = receivers()
        urgent = receivers()
        settings = make_settings(
            {
                "name": "acme",
                "url": normal.url,
                "escalation_provider": "acme-urgent",
                "escalation_template": "generic.json.j2",
            },
            {"name": "acme-urgent", "url": urgent.url, "template": "slack.json.j2"},
        )
        self._closed_incident(session_factory, node_name="gpu-node-1", days_ago=10, gpu=None)
        ticket_id = new_ticket(session_factory)
        (outcome,) = run(session_factory, settings, client, NOW).outcomes
        assert outcome.result == "delivered" and outcome.provider == "acme-urgent"
        assert normal.requests == []
        (request,) = urgent.requests
        payload = request.json  # the escalation template of the requesting provider wins
        assert payload["escalated"] is True
        assert payload["escalation"]["previous"][0]["kind"] == "node"
        assert payload["title"].startswith("REPEAT ")
        ticket, _ = get(session_factory, ticket_id)
        assert ticket.escalated is True and ticket.provider == "acme-urgent"
        assert ticket.escalation is not None and ticket.escalation["from_provider"] == "acme"
        with session_factory() as session:
            incident = session.get(Incident, ticket.incident_id)
            assert incident is not None and incident.escalated

    def test_gpu_moved_to_another_node_escalates(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client
    ) -> None:
        rcv = receivers()
        settings = make_settings({"name": "acme", "url": rcv.url})
        self._closed_incident(session_factory, node_name="gpu-node-9", days_ago=3, gpu=UUID)
        new_ticket(session_factory)
        run(session_factory, settings, client, NOW)
        payload = rcv.requests[0].json
        assert payload["escalated"] is True
        (previous,) = payload["escalation"]["previous"]
        assert (previous["kind"], previous["gpu"], previous["node"]) == ("gpu", UUID, "gpu-node-9")

    def test_outside_the_window_does_not_escalate(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client
    ) -> None:
        rcv = receivers()
        settings = make_settings({"name": "acme", "url": rcv.url}, repeat_window_days=30)
        self._closed_incident(session_factory, node_name="gpu-node-1", days_ago=31, gpu=UUID)
        ticket_id = new_ticket(session_factory)
        run(session_factory, settings, client, NOW)
        assert rcv.requests[0].json["escalated"] is False
        assert get(session_factory, ticket_id)[0].escalated is False


class TestSecrets:
    def test_secret_never_in_logs_or_errors(
        self,
        session_factory: sessionmaker[Session],
        receivers: Any,
        client: httpx.Client,
        secret_env: str,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.DEBUG)
        url_token = "T0KEN4567890abcdefXYZ"
        rcv = receivers(fail_first=1, secret=SECRET.encode())
        dead = f"http://127.0.0.1:{free_port()}/services/T01/B02/{url_token}?token={url_token}"
        settings = make_settings(
            {"name": "acme", "url": f"{rcv.url}/services/T01/B02/{url_token}", "secret_env": secret_env},
            {"name": "dead", "url": dead, "secret_env": secret_env, "timeout_seconds": 2},
        )
        ok_ticket = new_ticket(session_factory)
        dead_ticket = new_ticket(session_factory, provider="dead", node_name="gpu-node-2")
        for hours in (0, 1):
            run(session_factory, settings, client, NOW + timedelta(hours=hours))

        assert get(session_factory, ok_ticket)[0].status == TicketStatus.SENT
        dead_row, _ = get(session_factory, dead_ticket)
        assert "REDACTED" in (dead_row.last_error or "")
        stored: list[str] = []
        with session_factory() as session:
            for ticket in session.scalars(select(Ticket)):
                stored += [ticket.last_error or "", json.dumps(ticket.escalation)]
            for message in session.scalars(select(OutboxMessage)):
                stored += [message.last_error or "", message.body]
            for action in session.scalars(select(Action)):
                stored += [action.error or "", json.dumps(action.detail)]
            stored += [str(row) for row in service.list_tickets(session)]
        texts = [caplog.text, *stored, *(r.body.decode() for r in rcv.requests)]
        for text in texts:
            assert SECRET not in text
            assert url_token not in text

    def test_header_secrets_from_env_are_sent_not_logged(
        self,
        session_factory: sessionmaker[Session],
        receivers: Any,
        client: httpx.Client,
        monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.DEBUG)
        monkeypatch.setenv("TEST_JIRA_AUTH", "Basic c3JlOmFwaXRva2VuMTIz")
        rcv = receivers(reject_status=401)
        settings = make_settings(
            {
                "name": "acme",
                "url": rcv.url,
                "headers": {"Authorization": "${env:TEST_JIRA_AUTH}", "X-Team": "gpu"},
            }
        )
        ticket_id = new_ticket(session_factory)
        run(session_factory, settings, client, NOW)
        (request,) = rcv.requests
        assert request.headers["authorization"] == "Basic c3JlOmFwaXRva2VuMTIz"
        assert request.headers["x-team"] == "gpu"
        assert "c3JlOmFwaXRva2VuMTIz" not in caplog.text
        assert "c3JlOmFwaXRva2VuMTIz" not in (get(session_factory, ticket_id)[0].last_error or "")

    def test_missing_header_secret_is_retried_and_named(
        self, session_factory: sessionmaker[Session], receivers: Any, client: httpx.Client
    ) -> None:
        rcv = receivers()
        settings = make_settings(
            {"name": "acme", "url": rcv.url, "headers": {"Authorization": "${env:NOPE_X}"}}
        )
        ticket_id = new_ticket(session_factory)
        (outcome,) = run(session_factory, settings, client, NOW).outcomes
        assert outcome.result == "retry"
        assert "NOPE_X is not set" in (get(session_factory, ticket_id)[0].last_error or "")
        assert rcv.requests == []
