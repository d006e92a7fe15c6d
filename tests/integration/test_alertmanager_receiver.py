"""Alertmanager's webhook receiver (``POST /api/v1/alertmanager/webhook``), over real HTTP.

The app is healer's dashboard app (uvicorn on loopback); behind it, in place of ``healer run``'s
controller, a leader whose early ticks go through the real :class:`~healer.controller.wake.Wakeups`
and only count. What the early tick does on a real cluster is tests/e2e/test_run_alertmanager.py.

- no token, a wrong one, another scheme, or none configured: 401, logged, no tick;
- a body that is not Alertmanager's message: 400 naming the field; over the body limit: 413;
- a payload naming a node that does not exist: one tick (a poll), nothing else;
- no alert of healer's rules: no tick; a standby: 503; ``healer serve`` (no controller): 404;
- a real Alertmanager delivers with the bearer token of its ``credentials_file`` (the
  configuration docs/operations.md shows), and with a wrong one is refused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.config import Settings, load_settings
from healer.controller.wake import Wakeups
from healer.store.models import Node
from healer.store.session import make_engine, make_sessionmaker
from healer.wiring import dashboard
from tests.integration.test_ticket_callbacks import serve
from tests.services import AlertmanagerServer, wait_until
from tests.unit.test_alertmanager_payload import alert, notification

PATH = "/api/v1/alertmanager/webhook"
TOKEN = "alertmanager-token-for-tests-0123456789"


@dataclass
class Leader:
    """The controller's side of the receiver: ``wake`` as :meth:`Controller.wake` answers it, its
    early ticks run by the real Wakeups and counted."""

    leading: bool = True
    ticks: int = 0
    wakeups: Wakeups = field(init=False)

    def __post_init__(self) -> None:
        self.wakeups = Wakeups(self._tick, min_interval=0.05)

    def _tick(self) -> None:
        self.ticks += 1

    def wake(self) -> bool:
        if not self.leading:
            return False
        self.wakeups.request()
        return True


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "alertmanager-token"
    path.write_text(TOKEN + "\n")  # as `kubectl create secret --from-file` keeps it
    return path


@pytest.fixture
def sessions(migrated_sqlite_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(migrated_sqlite_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def leader() -> Iterator[Leader]:
    made = Leader()
    made.wakeups.start()
    yield made
    made.wakeups.stop()


def settings(token_file: Path | None, **api: Any) -> Settings:
    detection: dict[str, Any] = {"mode": "alerts"}
    if token_file is not None:
        detection["alertmanager_token_file"] = str(token_file)
    return load_settings(prometheus={"url": "http://127.0.0.1:9"}, detection=detection, api=api)


@pytest.fixture
def receiver(
    sessions: sessionmaker[Session], leader: Leader, token_file: Path
) -> Iterator[Callable[..., httpx.Client]]:
    """``receiver(token_file=..., wake=..., **api)``: healer's app served on loopback."""
    with contextlib.ExitStack() as stack:

        def start(
            *, token: Path | None = token_file, wake: Callable[[], bool] | None = leader.wake, **api: Any
        ) -> httpx.Client:
            app = dashboard(settings(token, **api), sessions, wake=wake)
            return stack.enter_context(serve(app))

        yield start


def hot(node: str) -> dict[str, Any]:
    """A firing alert of healer's rule GpuTooHot naming ``node``."""
    return alert(alertname="GpuTooHot", healer_rule="GpuTooHot", Hostname=node, gpu="3")


BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({}, "no Authorization header"),
        ({"Authorization": "Bearer not-the-token"}, "wrong bearer token"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "wrong bearer token"),
        ({"Authorization": f"Basic {TOKEN}"}, "Authorization must be 'Bearer <token>'"),
    ],
)
def test_refuses_a_request_without_the_token(
    receiver: Callable[..., httpx.Client],
    leader: Leader,
    caplog: pytest.LogCaptureFixture,
    headers: dict[str, str],
    why: str,
) -> None:
    client = receiver()
    with caplog.at_level(logging.WARNING):
        r = client.post(PATH, json=notification(hot("gpu-01")), headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert why in r.json()["error"]["message"]
    assert f"refused an Alertmanager notification from 127.0.0.1: {why}" in caplog.text
    assert leader.ticks == 0 and not leader.wakeups.pending
    assert 'healer_alertmanager_notifications_total{result="refused"} 1.0' in client.get("/metrics").text


def test_refuses_everything_when_no_token_is_configured(
    receiver: Callable[..., httpx.Client], leader: Leader
) -> None:
    client = receiver(token=None)
    r = client.post(PATH, json=notification(hot("gpu-01")), headers=BEARER)
    assert r.status_code == 401
    message = r.json()["error"]["message"]
    assert "no token is configured (detection.alertmanager_token_file or _env)" in message
    assert leader.ticks == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "Invalid JSON"),
        (
            json.dumps({**notification(hot("gpu-01")), "version": "3"}).encode(),
            "version: Input should be '4'",
        ),
        (json.dumps({"version": "4"}).encode(), "alerts: Field required"),
        (
            json.dumps(notification({**hot("gpu-01"), "status": "pending"})).encode(),
            "alerts.0.status: Input should be 'firing' or 'resolved'",
        ),
    ],
)
def test_a_malformed_body_is_refused_naming_the_field(
    receiver: Callable[..., httpx.Client], leader: Leader, body: bytes, message: str
) -> None:
    r = receiver().post(PATH, content=body, headers={**BEARER, "Content-Type": "application/json"})
    assert r.status_code == 400
    text = r.json()["error"]["message"]
    assert text.startswith("not an Alertmanager webhook message (version 4): ")
    assert message in text
    assert leader.ticks == 0


def test_a_body_over_the_limit_is_refused_before_it_is_read(
    receiver: Callable[..., httpx.Client], leader: Leader
) -> None:
    big = notification(*(hot(f"gpu-{i:04d}") for i in range(100)))
    r = receiver(max_body_bytes=4096).post(PATH, json=big, headers=BEARER)
    assert r.status_code == 413
    assert leader.ticks == 0


def test_a_node_that_does_not_exist_costs_one_poll_and_nothing_else(
    receiver: Callable[..., httpx.Client], leader: Leader, sessions: sessionmaker[Session]
) -> None:
    client = receiver()
    r = client.post(PATH, json=notification(hot("no-such-node")), headers=BEARER)
    assert r.status_code == 200
    assert r.json() == {
        "woken": True,
        "alerts": 1,
        "healer_alerts": 1,
        "rules": ["GpuTooHot"],
        "nodes": ["no-such-node"],
    }
    wait_until(lambda: leader.ticks == 1, timeout=10, what="the early tick")
    assert 'healer_alertmanager_notifications_total{result="woken"} 1.0' in client.get("/metrics").text
    with sessions() as s:
        assert s.scalars(select(Node.name)).all() == []


def test_alerts_of_other_rules_wake_nothing(receiver: Callable[..., httpx.Client], leader: Leader) -> None:
    other = {**hot("gpu-01"), "labels": {"alertname": "Watchdog"}}
    r = receiver().post(PATH, json=notification(other), headers=BEARER)
    assert r.status_code == 200
    assert r.json()["woken"] is False and r.json()["healer_alerts"] == 0
    assert leader.ticks == 0 and not leader.wakeups.pending


def test_a_standby_answers_503_so_alertmanager_retries(
    receiver: Callable[..., httpx.Client], leader: Leader
) -> None:
    leader.leading = False
    r = receiver().post(PATH, json=notification(hot("gpu-01")), headers=BEARER)
    assert r.status_code == 503
    assert "does not lead" in r.json()["error"]["message"]
    assert leader.ticks == 0


def test_healer_serve_has_no_controller_to_wake(receiver: Callable[..., httpx.Client]) -> None:
    r = receiver(wake=None).post(PATH, json=notification(hot("gpu-01")), headers=BEARER)
    assert r.status_code == 404
    assert "point Alertmanager at healer run" in r.json()["error"]["message"]


@pytest.mark.alertmanager
def test_a_real_alertmanager_delivers_with_its_credentials_file(
    receiver: Callable[..., httpx.Client],
    leader: Leader,
    alertmanager: AlertmanagerServer,
    token_file: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = receiver()
    url = f"{client.base_url}{PATH}"
    node = f"am-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.INFO)
    alertmanager.deliver_to(url, token_file)
    alertmanager.post_alerts([{"labels": hot(node)["labels"], "annotations": {"summary": "hot"}}])
    wait_until(lambda: f"naming {node}: early tick" in caplog.text, timeout=30, what="the notification")
    wait_until(lambda: leader.ticks >= 1, timeout=10, what="the early tick")

    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token")
    alertmanager.deliver_to(url, wrong)
    ticks = leader.ticks
    refused = "refused an Alertmanager notification from 127.0.0.1: wrong bearer token"
    other = f"am-{uuid.uuid4().hex[:8]}"
    alertmanager.post_alerts([{"labels": hot(other)["labels"], "annotations": {}}])
    wait_until(lambda: refused in caplog.text, timeout=30, what="the refused notification")
    assert f"naming {other}" not in caplog.text
    assert leader.ticks == ticks
