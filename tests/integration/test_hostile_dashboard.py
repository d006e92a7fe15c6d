"""The dashboard and API under crafted requests: cursors, ids, framing and sniffing, the API's own
documentation, and the deployment's anonymous access. Real HTTP to the app over uvicorn."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy.orm import Session, sessionmaker

from tests.helm import rendered_objects, require_helm
from tests.integration.test_api_support import (
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    bearer,
    build_app,
    csrf_from,
    http_client,
    login,
    make_settings,
    seed,
)

REPO = Path(__file__).resolve().parents[2]
LISTINGS = [
    "/api/v1/nodes",
    "/api/v1/nodes?sort=name",
    "/api/v1/nodes/gpu-node-07/history",
    "/api/v1/incidents",
    "/api/v1/findings",
    "/api/v1/tickets",
    "/api/v1/audit",
    "/",
]


def b64(value: object) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


CRAFTED_CURSORS = {
    "huge id": b64(["since", "2026-03-01T12:00:00+00:00", 10**40]),
    "huge id by name": b64(["name", "gpu-node-07", 10**40]),
    "id true": b64(["since", "2026-03-01T12:00:00+00:00", True]),
    "negative id": b64(["name", "a", -1]),
    "deep nesting": b64(b"[" * 3000 + b"]" * 3000),
    "nested within the length limit": b64(b"[" * 300 + b"]" * 300),
    "key a mapping": b64(["name", {"$ne": 1}, 1]),
    "key a number": b64(["since", 1e308, 1]),
    "not base64": "%%%***",
    "not json": b64(b"\xff\xfe\x00"),
    "too long": "A" * 5000,
    "wrong shape": b64({"a": 1}),
}


@pytest.fixture
def client(session_factory: sessionmaker[Session]) -> Iterator[httpx.Client]:
    seed(session_factory)
    with http_client(build_app(session_factory)) as c:
        yield c


@pytest.mark.parametrize("cursor", list(CRAFTED_CURSORS.values()), ids=list(CRAFTED_CURSORS))
def test_crafted_cursors_are_400_with_a_clear_body(client: httpx.Client, cursor: str) -> None:
    for listing in LISTINGS:
        sep = "&" if "?" in listing else "?"
        r = client.get(f"{listing}{sep}cursor={cursor}", headers=bearer(VIEWER_TOKEN))
        assert r.status_code == 400, (listing, r.status_code, r.text[:300])
        if listing.startswith("/api/"):
            assert r.json()["error"]["code"] == "invalid_cursor"
        assert "Traceback" not in r.text


@pytest.mark.parametrize("ticket_id", ["99999999999999999999999", "2147483648", "0", "-5"])
def test_out_of_range_ticket_ids_are_400(client: httpx.Client, ticket_id: str) -> None:
    r = client.post(f"/api/v1/tickets/{ticket_id}/close", json={}, headers=bearer(OPERATOR_TOKEN))
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", r.text
    page = client.get(f"/tickets/{ticket_id}/close", headers=bearer(OPERATOR_TOKEN))
    assert page.status_code == 400


def test_security_headers_on_every_response(client: httpx.Client) -> None:
    for path, status in (
        ("/", 200),
        ("/api/v1/nodes", 200),
        ("/healthz", 200),
        ("/metrics", 200),
        ("/static/style.css", 200),
        ("/nodes/none-such", 404),
        ("/api/v1/nothing", 404),
    ):
        r = client.get(path)
        assert r.status_code == status, path
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
        directives = dict(
            d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";") if d.strip()
        )
        # Scripts only from the dashboard's own static files (fleet.js): no inline, no eval, no CDN.
        assert directives["script-src"] == "'self'", path
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
    assert client.get("/").headers["cache-control"] == "no-store"
    too_big = client.post("/api/v1/pause", content=b"x" * (2 * 1024 * 1024))
    assert too_big.status_code == 413 and too_big.headers["x-frame-options"] == "DENY"


def test_api_docs_are_local_and_behind_the_access_rules(session_factory: sessionmaker[Session]) -> None:
    seed(session_factory)
    with http_client(build_app(session_factory, make_settings(anonymous_role="none"))) as c:
        for path in ("/openapi.json", "/api/v1/nodes"):
            assert c.get(path).status_code == 401, path
        assert c.get("/docs").status_code in (303, 401)  # a page: to the login form
        spec = c.get("/openapi.json", headers=bearer(VIEWER_TOKEN)).json()
        assert "/api/v1/nodes" in spec["paths"]
        docs = c.get("/docs", headers=bearer(VIEWER_TOKEN))
        assert docs.status_code == 200 and "/api/v1/nodes/{name}/release" in docs.text
        assert "<script" not in docs.text and "cdn" not in docs.text.lower()
        assert c.get("/redoc").status_code in (303, 401, 404)


def test_deploy_has_no_anonymous_access() -> None:
    """The Helm chart's default install shows nothing to a caller without a token."""
    (settings_map,) = [
        o
        for o in rendered_objects(require_helm())
        if o["kind"] == "ConfigMap" and "healer.yaml" in o.get("data", {})
    ]
    config = yaml.safe_load(settings_map["data"]["healer.yaml"])
    assert config["api"]["anonymous_role"] == "none"


def test_logout_ends_a_copied_session_cookie(session_factory: sessionmaker[Session]) -> None:
    seed(session_factory)
    app = build_app(session_factory, make_settings(anonymous_role="none"))
    with http_client(app) as victim:
        csrf = login(victim, VIEWER_TOKEN)
        stolen = victim.cookies.get("healer_session")
        assert stolen
        with httpx.Client(base_url=str(victim.base_url), timeout=10) as thief:
            thief.cookies.set("healer_session", stolen)
            assert thief.get("/api/v1/status").status_code == 200  # the copy works while logged in
            assert victim.post("/logout", data={"csrf_token": csrf}).status_code == 303
            assert thief.get("/api/v1/status").status_code == 401  # and not after the logout
            assert thief.get("/").status_code == 303  # a page: back to the login form


def test_csrf_token_is_bound_to_the_login_session(session_factory: sessionmaker[Session]) -> None:
    seed(session_factory)
    app = build_app(session_factory, make_settings(anonymous_role="none"))
    with http_client(app) as attacker, httpx.Client(base_url=str(attacker.base_url), timeout=10) as victim:
        planted_token = csrf_from(attacker.get("/login").text)
        planted_cookie = attacker.cookies.get("healer_csrf")
        own = login(victim, OPERATOR_TOKEN)
        # The attacker plants their CSRF cookie in the victim's browser (e.g. from a sibling
        # subdomain) and makes it post a form with the matching token: refused.
        victim.cookies.set("healer_csrf", planted_cookie)
        forged = victim.post("/controls/pause", data={"csrf_token": planted_token, "confirm": "yes"})
        assert forged.status_code == 403 and "CSRF" in forged.text
        assert "Pause running" in victim.get("/").text or "paused" not in victim.get("/").text.lower()
        victim.cookies.delete("healer_csrf")
        with httpx.Client(base_url=str(attacker.base_url), timeout=10) as fresh:
            fresh_csrf = login(fresh, OPERATOR_TOKEN)
            assert (
                fresh.post("/controls/pause", data={"csrf_token": fresh_csrf, "confirm": "yes"}).status_code
                == 303
            )
        assert own  # the victim's own token was for its own session


def test_probes_answer_while_node_pages_pile_up(session_factory: sessionmaker[Session]) -> None:
    """200 node pages at once against a Prometheus that never answers: /healthz and /readyz still
    answer quickly (a liveness probe times out after a few seconds)."""
    seed(session_factory)
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(512)
        settings = make_settings()
        prometheus = settings.prometheus.model_copy(
            update={"url": f"http://127.0.0.1:{hung.getsockname()[1]}"}
        )
        app = build_app(session_factory, settings.model_copy(update={"prometheus": prometheus}))
        with http_client(app) as client, ThreadPoolExecutor(max_workers=200) as pool:
            url = str(client.base_url.join("/nodes/gpu-node-07"))
            pages = [
                pool.submit(httpx.get, url, headers=bearer(VIEWER_TOKEN), timeout=120) for _ in range(200)
            ]
            time.sleep(1.0)  # the pages now hold the request threads
            probe_seconds = []
            for _ in range(5):
                started = time.monotonic()
                assert client.get("/healthz", timeout=10).status_code == 200
                ready = client.get("/readyz", timeout=10)
                probe_seconds.append(time.monotonic() - started)
                assert ready.status_code in (200, 503)
            answers = [p.result() for p in pages]
    assert max(probe_seconds) < 3.0, probe_seconds
    assert all(a.status_code == 200 for a in answers)
    busy = [a for a in answers if "too many charts" in a.text]
    assert busy, "the chart gate turned some pages away from Prometheus"
