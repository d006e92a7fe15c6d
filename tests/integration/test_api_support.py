"""Fixtures and seed data shared by the API tests (``test_api_*.py``); holds no tests itself.

The seed is a small fleet as the controller would have recorded it: a quarantined node with an
open incident, transitions, findings (one with an HTML label value), GPUs, a ticket whose delivery
failed; a node awaiting repair with an acknowledged ticket; healthy nodes; a tripped breaker; rule
evaluations; a rejected rule reload; dry-run and refused actions.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

from healer.config import Settings, load_settings
from healer.model.states import ActionStatus, NodeState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store import nodes as repo
from healer.store.models import Finding, Gpu, OutboxMessage, RuleEvaluation, Ticket
from healer.wiring import dashboard
from tests.conftest import REPO
from tests.services import free_port, text_exporter, wait_until

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
OPERATOR_TOKEN = "op-token-0123456789abcdef"
VIEWER_TOKEN = "viewer-token-0123456789abcdef"
CSRF_SECRET = "test-secret-not-for-production"
EVIL_LABEL = '<script>alert("x")</script>'

RULESET = RuleSet(
    groups=(
        RuleGroup(
            name="gpu-thermal",
            rules=[
                Rule.model_validate(
                    {
                        "name": "GpuTooHot",
                        "expr": "max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 78",
                        "for": "5m",
                        "actions": ["quarantine", {"ticket": {"provider": "default"}}],
                    }
                ),
                Rule.model_validate({"name": "XidFatal", "expr": "DCGM_FI_DEV_XID_ERRORS == 79"}),
            ],
        ),
    ),
    sources=("rules/gpu.yaml",),
)


def make_settings(**api: object) -> Settings:
    """Settings for tests: an operator and a viewer token, a fixed CSRF secret, no Prometheus, and
    anonymous requests read-only (``anonymous_role: viewer``; the default is ``none``)."""
    return load_settings(
        prometheus={"url": "http://127.0.0.1:9", "timeout_seconds": 1.0},
        api={
            "tokens": [
                {"token": OPERATOR_TOKEN, "user": "alice", "role": "operator"},
                {"token": VIEWER_TOKEN, "user": "victor", "role": "viewer"},
            ],
            "csrf_secret": CSRF_SECRET,
            "anonymous_role": "viewer",
            **api,
        },
    )


@dataclass
class Seeded:
    """Ids of the seeded rows tests refer to."""

    hot_ticket_id: int
    acked_ticket_id: int


def seed(factory: sessionmaker[Session], *, now: datetime = NOW) -> Seeded:
    """Record the small fleet described in the module docstring."""
    with factory() as s, s.begin():
        hot = repo.get_or_create_node(s, "gpu-node-07", now=now - timedelta(days=10), pool="h100")
        for i in range(8):
            s.add(
                Gpu(
                    uuid=f"GPU-0000-{i}",
                    node_id=hot.id,
                    index=i,
                    pci_bus_id=f"00000000:{18 + i:02X}:00.0",
                    model_name="NVIDIA H100 80GB HBM3",
                    first_seen=now - timedelta(days=10),
                    last_seen=now,
                )
            )
        opened = now - timedelta(hours=1)
        incident = repo.ensure_incident(s, hot, now=opened, summary="GPU 3 too hot")
        repo.transition(
            s,
            hot,
            NodeState.SUSPECT,
            now=opened,
            actor="healer",
            reason="GpuTooHot pending",
            evidence={"rule": "GpuTooHot", "value": 84.0, "labels": {"gpu": "3"}},
        )
        repo.transition(
            s,
            hot,
            NodeState.QUARANTINED,
            now=opened + timedelta(minutes=5),
            actor="healer",
            reason="GpuTooHot firing for 5m",
            evidence={"rule": "GpuTooHot", "value": 85.5},
        )
        s.add(
            Finding(
                rule="GpuTooHot",
                series_key="gpu-node-07/3",
                node_name=hot.name,
                gpu="3",
                state="firing",
                severity="critical",
                value=85.5,
                unit="degrees C",
                labels={"gpu": "3", "Hostname": hot.name, "modelName": EVIL_LABEL},
                summary="GPU 3 above 78 C",
                active_since=opened,
                fired_at=opened + timedelta(minutes=5),
                resolved_at=None,
                last_seen_at=now,
                incident_id=incident.id,
            )
        )
        hot_ticket = Ticket(
            incident_id=incident.id,
            node_id=hot.id,
            provider="default",
            idempotency_key="k-hot",
            status="pending",
            created_at=opened + timedelta(minutes=6),
            updated_at=now,
        )
        s.add(hot_ticket)
        s.flush()
        s.add(
            OutboxMessage(
                ticket_id=hot_ticket.id,
                provider="default",
                idempotency_key="k-hot",
                body="{}",
                status="pending",
                attempts=3,
                next_attempt_at=now + timedelta(minutes=1),
                last_status_code=503,
                last_error="provider unavailable",
                created_at=opened + timedelta(minutes=6),
            )
        )
        repo.record_action(
            s,
            kind="cordon",
            status=ActionStatus.DRY_RUN,
            actor="healer",
            now=opened + timedelta(minutes=5),
            node=hot,
            incident=incident,
        )

        waiting = repo.get_or_create_node(s, "gpu-node-03", now=now - timedelta(days=10), pool="h100")
        inc2 = repo.ensure_incident(s, waiting, now=now - timedelta(days=2), summary="Xid 79")
        repo.transition(
            s,
            waiting,
            NodeState.AWAITING_REPAIR,
            now=now - timedelta(days=1),
            actor="healer",
            reason="drained",
        )
        acked = Ticket(
            incident_id=inc2.id,
            node_id=waiting.id,
            provider="default",
            idempotency_key="k-acked",
            status="acknowledged",
            external_id="RMA-42",
            created_at=now - timedelta(days=1),
            sent_at=now - timedelta(days=1),
            acknowledged_at=now - timedelta(hours=20),
            updated_at=now,
        )
        s.add(acked)
        s.add(
            Finding(
                rule="XidFatal",
                series_key="gpu-node-03/1",
                node_name=waiting.name,
                gpu="1",
                state="firing",
                value=79.0,
                labels={"gpu": "1", "err_code": "79"},
                active_since=now - timedelta(days=2),
                last_seen_at=now,
            )
        )
        blocked = repo.get_or_create_node(s, "gpu-node-11", now=now - timedelta(days=10), pool="a100")
        repo.transition(
            s, blocked, NodeState.BLOCKED, now=now - timedelta(hours=3), actor="healer", reason="budget"
        )
        repo.record_action(
            s,
            kind="quarantine",
            status=ActionStatus.REFUSED,
            actor="healer",
            now=now - timedelta(hours=3),
            node=blocked,
            error="budget: 2 of 2 nodes of pool a100 already out",
        )
        for i in range(3):
            repo.get_or_create_node(s, f"gpu-node-2{i}", now=now - timedelta(days=10), pool="a100")
        s.flush()

        repo.set_switch(
            s,
            repo.SWITCH_BREAKER,
            {
                "tripped": True,
                "reason": "6 nodes went bad in 300s",
                "tripped_at": now.isoformat(),
                "held": ["gpu-node-21"],
            },
            now=now,
            by="healer",
        )
        repo.set_switch(
            s,
            repo.SWITCH_LAST_TICK,
            {"at": (now - timedelta(seconds=20)).isoformat(), "duration_seconds": 0.8, "leader": "healer-0"},
            now=now,
            by="healer",
        )
        repo.set_switch(
            s,
            repo.SWITCH_RULESET,
            {
                "loaded_at": (now - timedelta(days=1)).isoformat(),
                "sources": ["rules/gpu.yaml"],
                "rejected": [
                    {"at": now.isoformat(), "error": "rules/bad.yaml:3:5: groups.0.rules.0.for: <b>bad</b>"}
                ],
            },
            now=now,
            by="healer",
        )
        for minutes, health, error in ((2, "ok", None), (1, "error", "bad_data: parse error")):
            s.add(
                RuleEvaluation(
                    rule="XidFatal",
                    group="gpu-thermal",
                    evaluated_at=now - timedelta(minutes=minutes),
                    duration_seconds=0.05,
                    health=health,
                    error=error,
                    series=8,
                    firing=1,
                )
            )
        s.add(
            RuleEvaluation(
                rule="GpuTooHot",
                group="gpu-thermal",
                evaluated_at=now - timedelta(seconds=30),
                duration_seconds=0.12,
                health="ok",
                series=64,
                firing=1,
            )
        )
        s.flush()
        return Seeded(hot_ticket_id=hot_ticket.id, acked_ticket_id=acked.id)


#: The seeded parts ledger: a GPU reset and repaired on one node, moved to another and failing there.
MOVED_GPU = "GPU-moved-0001"
EVIL_SERIAL = "<b>sn-1650</b>"


def _failure(uuid: str | None, *, device: str | None = None, serial: str | None = None) -> dict[str, object]:
    labels = {"UUID": uuid, "serial": serial} if uuid else {"device": device}
    return {"findings": [{"rule": "GpuFatalXidRecent", "labels": {k: v for k, v in labels.items() if v}}]}


def seed_parts(factory: sessionmaker[Session], *, now: datetime = NOW) -> None:
    """Record the ledger's story: GPU :data:`MOVED_GPU` (serial :data:`EVIL_SERIAL`, HTML in it)
    fails on gpu-node-a1 three hours ago, is reset by the node agent, repaired and returned; it fails
    again on gpu-node-b2 an hour ago (a repeat part, a ticket to acme). HCA mlx5_0 of gpu-node-c3
    fails, is rebooted, repaired and returned (a part repaired before)."""
    with factory() as s, s.begin():
        for name, part, at, step in (
            ("gpu-node-a1", _failure(MOVED_GPU, serial=EVIL_SERIAL), now - timedelta(hours=3), "reset-gpu"),
            ("gpu-node-c3", _failure(None, device="mlx5_0"), now - timedelta(hours=5), "reboot"),
        ):
            node = repo.get_or_create_node(s, name, now=at - timedelta(days=1), pool="h100")
            incident = repo.ensure_incident(s, node, now=at, summary="GpuFatalXidRecent firing")
            repo.transition(
                s, node, NodeState.QUARANTINED, now=at, actor="healer", reason="Xid 48", evidence=part
            )
            repo.record_action(
                s,
                kind="repair-request",
                status=ActionStatus.SUCCEEDED,
                actor="healer",
                now=at + timedelta(minutes=1),
                node=node,
                incident=incident,
                detail={"action": step},
            )
            repo.transition(
                s, node, NodeState.REPAIRED, now=at + timedelta(minutes=5), actor="healer", reason="done"
            )
            repo.transition(
                s, node, NodeState.HEALTHY, now=at + timedelta(minutes=15), actor="healer", reason="held"
            )
            repo.close_incident(s, node, now=at + timedelta(minutes=15), reason="returned to service")
        b = repo.get_or_create_node(s, "gpu-node-b2", now=now - timedelta(days=1), pool="h100")
        again = now - timedelta(hours=1)
        incident = repo.ensure_incident(s, b, now=again, summary="GpuFatalXidRecent firing")
        repo.transition(
            s,
            b,
            NodeState.QUARANTINED,
            now=again,
            actor="healer",
            reason="Xid 79",
            evidence=_failure(MOVED_GPU),
        )
        s.add(
            Ticket(
                incident_id=incident.id,
                node_id=b.id,
                provider="acme",
                idempotency_key="k-moved",
                status="pending",
                created_at=again + timedelta(minutes=1),
                updated_at=again + timedelta(minutes=1),
            )
        )


def build_app(factory: sessionmaker[Session], settings: Settings | None = None, **kwargs: object) -> FastAPI:
    """The app under test with a fixed clock and the test rule set; anonymous requests read-only
    (``anonymous_role: viewer``) unless ``settings`` chose a role."""
    if settings is not None and "anonymous_role" not in settings.api.model_fields_set:
        api = settings.api.model_copy(update={"anonymous_role": "viewer"})
        settings = settings.model_copy(update={"api": api})
    kwargs.setdefault("clock", lambda: NOW)
    kwargs.setdefault("ruleset_provider", lambda: RULESET)
    return dashboard(settings or make_settings(), factory, **kwargs)  # type: ignore[arg-type]


@contextlib.contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a thread; yield its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", access_log=False
        )
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=15, interval=0.02, what="uvicorn started")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@dataclass
class Served:
    """A ``healer serve`` process (:func:`healer_serve`) and its base URL."""

    process: subprocess.Popen[bytes]
    url: str


@contextlib.contextmanager
def healer_serve(database_url: str, *, output: int = subprocess.DEVNULL, **env: str) -> Iterator[Served]:
    """``healer serve`` in a process of its own on a free loopback port over ``database_url``:
    none of the caller's ``HEALER_`` settings, anonymous requests read-only, ``env`` added. Yields
    once ``/healthz`` answers; stops it (SIGTERM) on exit unless the caller already did."""
    port = free_port()
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HEALER_")},
        "HEALER_DATABASE__URL": database_url,
        "HEALER_API__ANONYMOUS_ROLE": "viewer",
        **env,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "healer", "serve", "--port", str(port)],
        cwd=REPO,
        env=environment,
        stdout=output,
        stderr=output,
    )
    served = Served(process, f"http://127.0.0.1:{port}")
    try:
        wait_until(lambda: httpx.get(f"{served.url}/healthz", timeout=1).status_code == 200, timeout=60)
        yield served
    finally:
        if process.poll() is None:
            process.terminate()
            process.communicate(timeout=30)


@contextlib.contextmanager
def http_client(app: FastAPI) -> Iterator[httpx.Client]:
    """An HTTP client (keeping cookies, like a browser) of ``app`` served by a real uvicorn."""
    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        yield c


@contextlib.contextmanager
def seeded_client(factory: sessionmaker[Session], **kwargs: object) -> Iterator[tuple[httpx.Client, Seeded]]:
    """Seed the database, serve the app over it, and yield a client (anonymous = viewer by default)."""
    ids = seed(factory)
    with http_client(build_app(factory, **kwargs)) as c:
        yield c, ids


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def csrf_from(html: str) -> str:
    """The CSRF token embedded in a page's forms."""
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


def login(client: httpx.Client, token: str) -> str:
    """Log the client in through the login form; return a CSRF token for further forms."""
    page = client.get("/login")
    r = client.post("/login", data={"token": token, "csrf_token": csrf_from(page.text), "next": "/"})
    assert r.status_code == 303, r.text
    return csrf_from(client.get("/").text)


def dcgm_scrape(node: str, *, gpus: int = 2, at: float) -> str:
    """A dcgm-exporter style scrape for ``node``: temperature and tensor activity per GPU, varying
    with ``at`` (unix seconds) so a chart has a shape."""
    lines = [
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
    ]
    labels = [
        f'gpu="{i}",UUID="GPU-0000-{i}",pci_bus_id="00000000:{18 + i:02X}:00.0",device="nvidia{i}",'
        f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"'
        for i in range(gpus)
    ]
    wobble = int(at) % 10
    lines += [f"DCGM_FI_DEV_GPU_TEMP{{{lab}}} {60 + 10 * i + wobble}" for i, lab in enumerate(labels)]
    lines += [
        "# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active.",
        "# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge",
    ]
    lines += [
        f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{lab}}} {0.2 + 0.3 * i + wobble / 100:.6f}"
        for i, lab in enumerate(labels)
    ]
    return "\n".join(lines) + "\n"


def dcgm_exporter(node: str, *, gpus: int = 2) -> contextlib.AbstractContextManager[str]:
    """Serve :func:`dcgm_scrape` for ``node`` at ``http://127.0.0.1:<port>/metrics``; yield host:port."""
    return text_exporter(lambda: dcgm_scrape(node, gpus=gpus, at=time.time()))
