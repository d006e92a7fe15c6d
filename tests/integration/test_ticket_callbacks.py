"""Inbound provider status callbacks, the SRE's manual close, and provider statistics.

Callbacks are real HTTP requests to uvicorn on loopback: to a minimal app holding only the
callback router, to the real dashboard app, and once end to end: the stand-in provider calling
back after receiving the webhook.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from api.routes.ticket_callbacks import router
from healer.config import Settings, load_settings
from healer.model.states import NodeState, OutboxStatus, TicketStatus
from healer.operations import OperationError
from healer.store.models import Action, CallbackNonce, Node, OutboxMessage, Ticket, Transition
from healer.tickets import service, signing
from healer.tickets.delivery import deliver_due
from healer_dev.provider import Receiver
from tests.integration.test_ticket_delivery import NOW, new_ticket
from tests.services import free_port, wait_until

CALLBACK_SECRET = "callback-secret-abcdef-123456"
PROVIDER_SECRET = "provider-secret-zyxwvu-987654"


def make_settings(**tickets: Any) -> Settings:
    return load_settings(
        tickets={
            "cluster_name": "test",
            "dashboard_url": "http://dashboard.test",
            "providers": [
                {"name": "acme", "url": "http://127.0.0.1:9/", "secret_env": "TEST_PROVIDER_SECRET"}
            ],
            "callback_secret_env": "TEST_CALLBACK_SECRET",
            "max_clock_skew_seconds": 300,
            **tickets,
        }
    )


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CALLBACK_SECRET", CALLBACK_SECRET)
    monkeypatch.setenv("TEST_PROVIDER_SECRET", PROVIDER_SECRET)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@contextmanager
def serve(app: FastAPI, port: int | None = None) -> Iterator[httpx.Client]:
    """Serve ``app`` with uvicorn on loopback; yield a client with its base URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=20, what="uvicorn")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def minimal_app(settings: Settings, factory: sessionmaker[Session], clock: Any) -> FastAPI:
    app = FastAPI()
    app.state.settings = settings
    app.state.session_factory = factory
    app.state.clock = clock
    app.include_router(router)
    return app


@pytest.fixture
def api(session_factory: sessionmaker[Session], clock: Clock) -> Iterator[httpx.Client]:
    with serve(minimal_app(make_settings(), session_factory, clock)) as client:
        yield client


def sent_ticket(factory: sessionmaker[Session]) -> int:
    """A ticket the provider accepted an hour ago, for a node awaiting repair."""
    ticket_id = new_ticket(factory, when=NOW - timedelta(hours=1))
    with factory() as session, session.begin():
        ticket = session.get(Ticket, ticket_id)
        assert ticket is not None
        ticket.status = TicketStatus.SENT
        ticket.sent_at = NOW - timedelta(hours=1)
        message = session.scalar(select(OutboxMessage).where(OutboxMessage.ticket_id == ticket_id))
        assert message is not None
        message.status = OutboxStatus.DELIVERED
    return ticket_id


def signed(
    payload: dict[str, Any], *, secret: str = CALLBACK_SECRET, at: datetime = NOW, ticket_id: int = 1
) -> tuple[bytes, dict[str, str]]:
    """A callback body for ``ticket_id`` and its headers, signed as a provider signs."""
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    path = signing.callback_path(ticket_id)
    headers.update(signing.callback_headers(secret.encode(), method="POST", path=path, body=body, now=at))
    return body, headers


def callback(client: httpx.Client, ticket_id: int, payload: dict[str, Any], **kw: Any) -> httpx.Response:
    body, headers = signed(payload, ticket_id=ticket_id, **kw)
    return client.post(f"/api/v1/tickets/{ticket_id}/status", content=body, headers=headers)


def snapshot(factory: sessionmaker[Session], ticket_id: int) -> dict[str, Any]:
    """Everything a callback could change."""
    with factory() as session:
        ticket = session.get(Ticket, ticket_id)
        assert ticket is not None
        node = session.get(Node, ticket.node_id)
        assert node is not None
        return {
            "status": ticket.status,
            "acknowledged_at": ticket.acknowledged_at,
            "resolved_at": ticket.resolved_at,
            "reason": ticket.reason,
            "external_id": ticket.external_id,
            "node": node.state,
            "transitions": session.scalar(select(func.count()).select_from(Transition)),
            "actions": session.scalar(select(func.count()).select_from(Action)),
            "nonces": session.scalar(select(func.count()).select_from(CallbackNonce)),
        }


class TestResolved:
    def test_signed_resolved_is_recorded_and_the_node_waits_for_the_controller(
        self, api: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        """Node state has one writer (issue 24): the callback records the ticket's status; the
        controller's next reconcile moves the node (tests/integration/test_remediation.py)."""
        ticket_id = sent_ticket(session_factory)
        at = NOW - timedelta(minutes=5)
        with session_factory() as session:
            before = session.scalar(select(func.count()).select_from(Transition))
        response = callback(
            api, ticket_id, {"status": "resolved", "external_id": "ACME-7", "at": at.isoformat()}
        )
        assert response.status_code == 200, response.text
        assert response.json() == {
            "ticket_id": ticket_id,
            "status": "resolved",
            "previous": "sent",
            "changed": True,
            "node_state": "awaiting_repair",
        }
        with session_factory() as session:
            ticket = session.get(Ticket, ticket_id)
            assert ticket is not None
            assert ticket.status == TicketStatus.RESOLVED
            assert ticket.resolved_at == at and ticket.acknowledged_at == at
            assert ticket.external_id == "ACME-7"
            node = session.get(Node, ticket.node_id)
            assert node is not None and node.state == NodeState.AWAITING_REPAIR
            assert session.scalar(select(func.count()).select_from(Transition)) == before
            (action,) = session.scalars(select(Action).where(Action.kind == "ticket_status")).all()
            assert action.actor == "provider:acme" and action.detail is not None
            assert action.detail["to"] == "resolved"

    def test_a_resolution_says_what_the_repair_found_and_goes_with_resolved_only(
        self, api: httpx.Client, session_factory: sessionmaker[Session], clock: Clock
    ) -> None:
        ticket_id = sent_ticket(session_factory)
        before = snapshot(session_factory, ticket_id)
        for wrong in (
            {"status": "acknowledged", "resolution": "replaced"},
            {"status": "resolved", "resolution": "meh"},
        ):
            assert callback(api, ticket_id, wrong).status_code == 422
        assert snapshot(session_factory, ticket_id) == before
        clock.now += timedelta(seconds=1)
        found = {"status": "resolved", "resolution": "no_fault_found"}
        response = callback(api, ticket_id, found, at=clock.now)
        assert response.status_code == 200, response.text
        with session_factory() as session:
            ticket = session.get(Ticket, ticket_id)
            assert ticket is not None and ticket.resolution == "no_fault_found"
            action = session.scalars(select(Action).where(Action.kind == "ticket_status")).one()
            assert action.detail is not None and action.detail["resolution"] == "no_fault_found"

    def test_duplicate_and_late_callbacks_change_nothing(
        self, api: httpx.Client, session_factory: sessionmaker[Session], clock: Clock
    ) -> None:
        ticket_id = sent_ticket(session_factory)
        t_ack = NOW - timedelta(minutes=50)
        t_done = NOW - timedelta(minutes=10)
        assert callback(api, ticket_id, {"status": "acknowledged", "at": t_ack.isoformat()}).json()["changed"]
        assert callback(api, ticket_id, {"status": "in_progress"}).json()["changed"]
        clock.now += timedelta(seconds=1)  # a fresh signature, not a replay
        assert callback(api, ticket_id, {"status": "resolved", "at": t_done.isoformat()}).json()["changed"]
        before = snapshot(session_factory, ticket_id)

        clock.now += timedelta(seconds=1)
        for payload in ({"status": "acknowledged"}, {"status": "in_progress"}, {"status": "resolved"}):
            response = callback(api, ticket_id, payload, at=clock.now)
            assert response.status_code == 200
            assert response.json()["changed"] is False
            assert response.json()["status"] == "resolved"
        after = snapshot(session_factory, ticket_id)
        assert {k: v for k, v in after.items() if k != "nonces"} == {
            k: v for k, v in before.items() if k != "nonces"
        }
        assert after["acknowledged_at"] == t_ack and after["resolved_at"] == t_done

    def test_needs_info_and_in_progress_alternate(
        self, api: httpx.Client, session_factory: sessionmaker[Session], clock: Clock
    ) -> None:
        ticket_id = sent_ticket(session_factory)
        assert callback(api, ticket_id, {"status": "in_progress"}).json()["changed"]
        clock.now += timedelta(seconds=1)
        reply = callback(api, ticket_id, {"status": "needs_info", "reason": "serial?"}, at=clock.now)
        assert reply.json()["changed"]
        clock.now += timedelta(seconds=1)
        assert callback(api, ticket_id, {"status": "in_progress"}, at=clock.now).json()["changed"]
        assert snapshot(session_factory, ticket_id)["reason"] == "serial?"

    def test_rejected_needs_a_reason_and_leaves_the_node(
        self, api: httpx.Client, session_factory: sessionmaker[Session], clock: Clock
    ) -> None:
        ticket_id = sent_ticket(session_factory)
        before = snapshot(session_factory, ticket_id)
        assert callback(api, ticket_id, {"status": "rejected"}).status_code == 422
        assert snapshot(session_factory, ticket_id) == before
        clock.now += timedelta(seconds=1)
        response = callback(api, ticket_id, {"status": "rejected", "reason": "out of warranty"}, at=clock.now)
        assert response.json()["status"] == "rejected"
        after = snapshot(session_factory, ticket_id)
        assert after["reason"] == "out of warranty"
        assert after["node"] == "awaiting_repair"

    def test_bad_body_is_422(self, api: httpx.Client, session_factory: sessionmaker[Session]) -> None:
        ticket_id = sent_ticket(session_factory)
        assert callback(api, ticket_id, {"status": "fixed-it"}).status_code == 422
        assert callback(api, ticket_id, {"status": "resolved", "at": "yesterday"}).status_code == 422

    def test_unknown_ticket_is_404_after_the_signature(self, api: httpx.Client) -> None:
        assert callback(api, 999, {"status": "resolved"}).status_code == 404
        body, _ = signed({"status": "resolved"}, ticket_id=999)
        assert api.post("/api/v1/tickets/999/status", content=body).status_code == 401


class TestRefused:
    @pytest.mark.parametrize(
        "make",
        [
            pytest.param(lambda b, h: (b, {"Content-Type": "application/json"}), id="unsigned"),
            pytest.param(
                lambda b, h: (b, signed(json.loads(b), secret="wrong-secret-000")[1]), id="wrong-secret"
            ),
            pytest.param(lambda b, h: (b.replace(b"resolved", b"rejected"), h), id="tampered-body"),
            pytest.param(
                lambda b, h: (b, signed(json.loads(b), at=NOW - timedelta(seconds=301))[1]), id="stale"
            ),
            pytest.param(
                lambda b, h: (b, signed(json.loads(b), at=NOW + timedelta(seconds=301))[1]),
                id="from-the-future",
            ),
            pytest.param(
                lambda b, h: (b, {**h, signing.SIGNATURE_HEADER: "sha256=" + "0" * 64}),
                id="garbage-signature",
            ),
        ],
    )
    def test_refused_with_401_and_nothing_changes(
        self, api: httpx.Client, session_factory: sessionmaker[Session], make: Any
    ) -> None:
        ticket_id = sent_ticket(session_factory)
        before = snapshot(session_factory, ticket_id)
        body, headers = make(*signed({"status": "resolved", "reason": "fixed"}, ticket_id=ticket_id))
        response = api.post(f"/api/v1/tickets/{ticket_id}/status", content=body, headers=headers)
        assert response.status_code == 401, response.text
        assert response.headers["WWW-Authenticate"] == "HMAC-SHA256"
        assert snapshot(session_factory, ticket_id) == before

    def test_replay_is_refused(
        self, api: httpx.Client, session_factory: sessionmaker[Session], clock: Clock
    ) -> None:
        ticket_id = sent_ticket(session_factory)
        body, headers = signed({"status": "acknowledged"}, ticket_id=ticket_id)
        url = f"/api/v1/tickets/{ticket_id}/status"
        assert api.post(url, content=body, headers=headers).status_code == 200
        after_first = snapshot(session_factory, ticket_id)
        clock.now += timedelta(seconds=30)  # still inside the skew window
        replay = api.post(url, content=body, headers=headers)
        assert replay.status_code == 401 and "replay" in replay.text
        assert snapshot(session_factory, ticket_id) == after_first
        # ... also against another ticket.
        other = new_ticket(session_factory, node_name="gpu-node-2")
        assert api.post(f"/api/v1/tickets/{other}/status", content=body, headers=headers).status_code == 401

    def test_nonces_are_pruned_after_the_window(
        self, api: httpx.Client, session_factory: sessionmaker[Session], clock: Clock
    ) -> None:
        ticket_id = sent_ticket(session_factory)
        callback(api, ticket_id, {"status": "acknowledged"})
        clock.now += timedelta(seconds=601)
        callback(api, ticket_id, {"status": "in_progress"}, at=clock.now)
        with session_factory() as session:
            assert session.scalars(select(CallbackNonce.received_at)).all() == [clock.now]

    def test_no_callback_secret_configured_refuses_all(
        self, session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        app = minimal_app(make_settings(callback_secret_env=None), session_factory, lambda: NOW)
        ticket_id = sent_ticket(session_factory)
        with serve(app) as client:
            assert callback(client, ticket_id, {"status": "resolved"}).status_code == 401
        assert snapshot(session_factory, ticket_id)["status"] == "sent"


class TestManualClose:
    def test_close_cancels_delivery_and_is_audited(self, session_factory: sessionmaker[Session]) -> None:
        ticket_id = new_ticket(session_factory)
        with session_factory() as session, session.begin():
            ticket = service.close_ticket(
                session, ticket_id=ticket_id, actor="alice", now=NOW, reason="vendor called by phone"
            )
            assert ticket.status == TicketStatus.CLOSED and ticket.closed_by == "alice"
        with session_factory() as session:
            message = session.scalar(select(OutboxMessage))
            assert message is not None and message.status == OutboxStatus.FAILED
            (action,) = session.scalars(select(Action).where(Action.kind == "ticket_close")).all()
            assert action.actor == "alice" and action.detail == {
                "ticket_id": ticket_id,
                "from": "pending",
                "reason": "vendor called by phone",
            }
        with httpx.Client() as client:
            report = deliver_due(
                session_factory=session_factory, settings=make_settings(), now=NOW, client=client
            )
        assert report.outcomes == []
        with (
            session_factory() as session,
            session.begin(),
            pytest.raises(OperationError, match="already closed"),
        ):
            service.close_ticket(session, ticket_id=ticket_id, actor="bob", now=NOW, reason="again")
        with session_factory() as session, session.begin(), pytest.raises(service.TicketNotFound):
            service.close_ticket(session, ticket_id=12345, actor="bob", now=NOW, reason="x")

    def test_callback_after_close_changes_nothing(
        self, api: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        ticket_id = sent_ticket(session_factory)
        with session_factory() as session, session.begin():
            service.close_ticket(session, ticket_id=ticket_id, actor="alice", now=NOW, reason="done")
        response = callback(api, ticket_id, {"status": "resolved"})
        assert response.json()["changed"] is False
        assert snapshot(session_factory, ticket_id)["node"] == "awaiting_repair"


class TestProviderStats:
    def test_medians_per_provider(self, session_factory: sessionmaker[Session]) -> None:
        ids = [new_ticket(session_factory, node_name=f"gpu-node-{i}") for i in range(1, 5)]
        with session_factory() as session, session.begin():
            for i, ticket_id in enumerate(ids[:3]):
                ticket = session.get(Ticket, ticket_id)
                assert ticket is not None
                ticket.status = TicketStatus.RESOLVED
                ticket.sent_at = NOW
                ticket.acknowledged_at = NOW + timedelta(minutes=10 * (i + 1))
                ticket.resolved_at = NOW + timedelta(hours=i + 1)
        with session_factory() as session:
            (stats,) = service.provider_stats(session)
        assert stats.provider == "acme"
        assert (stats.open, stats.total, stats.failed) == (1, 4, 0)
        assert stats.median_ack_seconds == 1200.0
        assert stats.median_repair_seconds == 7200.0


class TestRealApp:
    def test_secrets_never_in_api_responses(
        self, session_factory: sessionmaker[Session], caplog: pytest.LogCaptureFixture
    ) -> None:
        from healer.wiring import dashboard

        caplog.set_level(logging.DEBUG)
        token = "SECRETPATHTOKEN0123456789"
        settings = load_settings(
            tickets={
                "cluster_name": "test",
                "providers": [
                    {
                        "name": "acme",
                        "url": f"http://user:{token}@127.0.0.1:{free_port()}/services/T1/B2/{token}?key={token}",
                        "secret_env": "TEST_PROVIDER_SECRET",
                        "timeout_seconds": 2,
                    }
                ],
                "callback_secret_env": "TEST_CALLBACK_SECRET",
            },
            api={"anonymous_role": "viewer"},  # read every page without a token: none may leak it
        )
        ticket_id = new_ticket(session_factory)
        with httpx.Client() as client:
            (outcome,) = deliver_due(
                session_factory=session_factory, settings=settings, now=NOW, client=client
            ).outcomes
        assert outcome.result == "retry" and "REDACTED" in (outcome.error or "")
        app = dashboard(settings, session_factory, clock=lambda: NOW)
        texts = [caplog.text]
        with serve(app) as client:
            for path in (
                "/api/v1/tickets",
                "/api/v1/audit",
                "/api/v1/nodes/gpu-node-1",
                "/tickets",
                "/openapi.json",
            ):
                response = client.get(path)
                assert response.status_code == 200, (path, response.text)
                texts.append(response.text)
            texts.append(callback(client, ticket_id, {"status": "acknowledged"}).text)
            texts.append(callback(client, ticket_id, {"status": "resolved"}, secret="wrong-secret-000").text)
        assert any("acknowledged" in t for t in texts)
        for text in texts:
            for secret in (token, PROVIDER_SECRET, CALLBACK_SECRET):
                assert secret not in text

    def test_stand_in_provider_calls_back_over_http(self, session_factory: sessionmaker[Session]) -> None:
        """The demo's path: webhook to the receiver, which acknowledges and resolves through the real app."""
        from healer.wiring import dashboard

        port = free_port()
        settings = load_settings(
            tickets={
                "cluster_name": "test",
                "dashboard_url": f"http://127.0.0.1:{port}",
                "callback_secret_env": "TEST_CALLBACK_SECRET",
                "providers": [
                    {"name": "acme", "url": "http://127.0.0.1:9/", "secret_env": "TEST_PROVIDER_SECRET"}
                ],
            }
        )
        app = dashboard(settings, session_factory)  # the system clock: the receiver signs with it too
        receiver = Receiver(
            secret=PROVIDER_SECRET.encode(),
            callback_url=f"http://127.0.0.1:{port}",
            callback_secret=CALLBACK_SECRET.encode(),
            ack_after=0.0,
            resolve_after=0.3,
        ).start()
        try:
            with serve(app, port):
                now = datetime.now(UTC)
                ticket_id = new_ticket(session_factory, when=now)
                provider = settings.tickets.providers[0].model_copy(update={"url": receiver.url})
                live = settings.model_copy(
                    update={"tickets": settings.tickets.model_copy(update={"providers": [provider]})}
                )
                with httpx.Client() as client:
                    report = deliver_due(
                        session_factory=session_factory, settings=live, now=now, client=client
                    )
                assert [o.result for o in report.outcomes] == ["delivered"]

                def resolved() -> bool:
                    return snapshot(session_factory, ticket_id)["status"] == "resolved"

                wait_until(resolved, timeout=20, what="the provider's resolved callback")
        finally:
            receiver.stop()
        state = snapshot(session_factory, ticket_id)
        assert state["node"] == "awaiting_repair"  # the controller moves it (one writer)
        assert state["acknowledged_at"] is not None and state["acknowledged_at"] <= state["resolved_at"]
        assert [(c.status, c.http_status) for c in receiver.callbacks] == [
            ("acknowledged", 200),
            ("resolved", 200),
        ]
        assert receiver.requests[0].signature == "ok"
        assert (
            receiver.requests[0].json["callback_url"]
            == f"http://127.0.0.1:{port}/api/v1/tickets/{ticket_id}/status"
        )
