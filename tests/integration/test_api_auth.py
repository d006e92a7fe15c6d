"""Access control: bearer tokens, login cookies, proxy identity, anonymous role, CSRF."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.config import load_settings
from healer.wiring import dashboard
from tests.integration.test_api_support import (
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    Seeded,
    bearer,
    build_app,
    csrf_from,
    http_client,
    login,
    make_settings,
    seed,
)


@pytest.fixture
def seeded(session_factory: sessionmaker[Session]) -> Seeded:
    return seed(session_factory)


@pytest.fixture
def client(session_factory: sessionmaker[Session], seeded: Seeded) -> Iterator[httpx.Client]:
    with http_client(build_app(session_factory)) as c:
        yield c


@pytest.fixture
def closed_client(session_factory: sessionmaker[Session], seeded: Seeded) -> Iterator[httpx.Client]:
    """anonymous_role = none: nothing without a token."""
    with http_client(build_app(session_factory, make_settings(anonymous_role="none"))) as c:
        yield c


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def test_by_default_anonymous_requests_are_refused(
    session_factory: sessionmaker[Session], seeded: Seeded
) -> None:
    """Out of the box (no ``api.anonymous_role`` set) the API wants a token and pages a login."""
    with http_client(dashboard(load_settings(), session_factory)) as c:
        api = c.get("/api/v1/nodes")
        page = c.get("/")
        probe = c.get("/healthz")
    assert (api.status_code, error_code(api)) == (401, "unauthorized")
    assert (page.status_code, page.headers["location"]) == (303, "/login?next=%2F")
    assert probe.status_code == 200


class TestAnonymous:
    def test_none_refuses_api_with_401_and_error_body(self, closed_client: httpx.Client) -> None:
        r = closed_client.get("/api/v1/nodes")
        assert r.status_code == 401
        assert error_code(r) == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"

    def test_none_sends_pages_to_the_login_form(self, closed_client: httpx.Client) -> None:
        r = closed_client.get("/nodes/gpu-node-07")
        assert r.status_code == 303
        assert r.headers["location"] == "/login?next=%2Fnodes%2Fgpu-node-07"

    def test_none_still_answers_probes_and_scrapes(self, closed_client: httpx.Client) -> None:
        assert closed_client.get("/healthz").status_code == 200
        assert closed_client.get("/metrics").status_code == 200

    def test_token_works_when_anonymous_is_off(self, closed_client: httpx.Client) -> None:
        assert closed_client.get("/api/v1/nodes", headers=bearer(VIEWER_TOKEN)).status_code == 200

    def test_default_anonymous_viewer_reads_but_cannot_act(self, client: httpx.Client) -> None:
        assert client.get("/api/v1/nodes").status_code == 200
        page = client.get("/nodes/gpu-node-07")
        assert "anonymous" in page.text
        r = client.post(
            "/nodes/gpu-node-07/release", data={"csrf_token": csrf_from(page.text), "confirm": "yes"}
        )
        assert r.status_code == 403
        assert "needs the operator role" in r.text


class TestBearer:
    def test_unknown_token_is_401_not_anonymous(self, client: httpx.Client) -> None:
        r = client.get("/api/v1/nodes", headers=bearer("not-a-token-at-all-xxxx"))
        assert r.status_code == 401 and error_code(r) == "unauthorized"

    def test_malformed_authorization_is_401(self, client: httpx.Client) -> None:
        r = client.get("/api/v1/nodes", headers={"Authorization": f"Basic {OPERATOR_TOKEN}"})
        assert r.status_code == 401

    def test_bearer_post_needs_no_csrf(self, client: httpx.Client) -> None:
        r = client.post("/api/v1/pause", headers=bearer(OPERATOR_TOKEN))
        assert r.status_code == 200

    def test_viewer_bearer_is_403(self, client: httpx.Client) -> None:
        r = client.post("/api/v1/pause", headers=bearer(VIEWER_TOKEN))
        assert r.status_code == 403 and error_code(r) == "forbidden"


class TestLogin:
    def test_login_sets_a_strict_httponly_cookie_without_the_token(self, client: httpx.Client) -> None:
        page = client.get("/login")
        r = client.post(
            "/login", data={"token": OPERATOR_TOKEN, "csrf_token": csrf_from(page.text), "next": "/"}
        )
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith("healer_session="))
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert OPERATOR_TOKEN not in cookie
        assert "alice" in client.get("/").text

    def test_wrong_token_is_refused(self, client: httpx.Client) -> None:
        page = client.get("/login")
        r = client.post("/login", data={"token": "nope-nope-nope-nope", "csrf_token": csrf_from(page.text)})
        assert r.status_code == 401
        assert "Unknown token" in r.text
        assert "healer_session" not in client.cookies

    def test_login_needs_csrf(self, client: httpx.Client) -> None:
        client.get("/login")
        r = client.post("/login", data={"token": OPERATOR_TOKEN, "csrf_token": "0" * 64})
        assert r.status_code == 403

    def test_open_redirects_are_refused(self, client: httpx.Client) -> None:
        page = client.get("/login")
        r = client.post(
            "/login",
            data={"token": OPERATOR_TOKEN, "csrf_token": csrf_from(page.text), "next": "//evil.example/x"},
        )
        assert r.headers["location"] == "/"

    def test_forged_session_cookie_is_ignored(self, client: httpx.Client) -> None:
        client.cookies.set("healer_session", "eyJ0b2siOiJ4In0.forged.sig")
        assert "anonymous" in client.get("/").text

    def test_logout(self, client: httpx.Client) -> None:
        csrf = login(client, OPERATOR_TOKEN)
        r = client.post("/logout", data={"csrf_token": csrf})
        assert r.status_code == 303
        assert "anonymous" in client.get("/").text

    def test_operator_session_acts_through_forms(self, client: httpx.Client) -> None:
        csrf = login(client, OPERATOR_TOKEN)
        r = client.post(
            "/controls/pause", data={"csrf_token": csrf, "confirm": "yes", "reason": "maintenance"}
        )
        assert r.status_code == 303
        assert client.get("/api/v1/status").json()["paused"] is True
        audit = client.get("/api/v1/audit", params={"kind": "pause"}).json()["items"]
        assert audit[0]["actor"] == "alice"

    def test_viewer_session_is_refused(self, client: httpx.Client) -> None:
        csrf = login(client, VIEWER_TOKEN)
        r = client.post("/controls/pause", data={"csrf_token": csrf, "confirm": "yes"})
        assert r.status_code == 403
        assert client.get("/api/v1/status").json()["paused"] is False


class TestCsrf:
    def test_form_post_without_token_is_403(self, client: httpx.Client) -> None:
        login(client, OPERATOR_TOKEN)
        r = client.post("/controls/pause", data={"confirm": "yes"})
        assert r.status_code == 403
        assert "CSRF" in r.text
        assert client.get("/api/v1/status").json()["paused"] is False

    def test_token_of_another_browser_is_403(
        self, client: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        login(client, OPERATOR_TOKEN)
        other = httpx.Client(base_url=str(client.base_url))
        with other:
            foreign = csrf_from(other.get("/login").text)
        r = client.post("/controls/pause", data={"csrf_token": foreign, "confirm": "yes"})
        assert r.status_code == 403

    def test_cross_site_form_without_cookie_is_403(self, client: httpx.Client) -> None:
        # What a forged cross-site form looks like: SameSite=Strict keeps the cookies home.
        csrf = login(client, OPERATOR_TOKEN)
        r = httpx.post(
            f"{client.base_url}/controls/pause",
            data={"csrf_token": csrf, "confirm": "yes"},
            headers={"Origin": "https://evil.example"},
        )
        assert r.status_code == 403
        assert client.get("/api/v1/status").json()["paused"] is False

    def test_json_post_with_session_cookie_needs_the_csrf_header(self, client: httpx.Client) -> None:
        csrf = login(client, OPERATOR_TOKEN)
        r = client.post("/api/v1/pause")
        assert r.status_code == 403 and error_code(r) == "csrf"
        r = client.post("/api/v1/pause", headers={"X-CSRF-Token": csrf})
        assert r.status_code == 200

    def test_unconfirmed_form_changes_nothing(self, client: httpx.Client) -> None:
        csrf = login(client, OPERATOR_TOKEN)
        r = client.post("/nodes/gpu-node-07/release", data={"csrf_token": csrf})
        assert r.status_code == 400
        assert "Tick the confirmation box" in r.text
        assert client.get("/api/v1/nodes/gpu-node-07").json()["node"]["state"] == "quarantined"


class TestProxy:
    @pytest.fixture
    def proxied(self, session_factory: sessionmaker[Session], seeded: Seeded) -> Iterator[httpx.Client]:
        settings = make_settings(
            anonymous_role="none",
            proxy_user_header="X-Forwarded-User",
            proxy_groups_header="X-Forwarded-Groups",
            operator_groups=["sre"],
        )
        with http_client(build_app(session_factory, settings)) as c:
            yield c

    def test_user_header_identifies_a_viewer(self, proxied: httpx.Client) -> None:
        headers = {"X-Forwarded-User": "bob@example.com", "X-Forwarded-Groups": "dev, ml"}
        assert proxied.get("/api/v1/nodes", headers=headers).status_code == 200
        r = proxied.post("/api/v1/pause", headers=headers)
        assert r.status_code == 403 and error_code(r) == "forbidden"

    def test_operator_group_may_act_with_csrf(self, proxied: httpx.Client) -> None:
        headers = {"X-Forwarded-User": "carol@example.com", "X-Forwarded-Groups": "ml,sre"}
        page = proxied.get("/nodes/gpu-node-07", headers=headers)
        assert "carol@example.com" in page.text and "operator" in page.text
        # The proxy header is not a bearer header: a browser behind the proxy needs the CSRF token.
        assert error_code(proxied.post("/api/v1/pause", headers=headers)) == "csrf"
        r = proxied.post(
            "/controls/pause", headers=headers, data={"csrf_token": csrf_from(page.text), "confirm": "yes"}
        )
        assert r.status_code == 303
        audit = proxied.get("/api/v1/audit", params={"kind": "pause"}, headers=headers).json()["items"]
        assert audit[0]["actor"] == "carol@example.com"

    def test_no_header_is_401(self, proxied: httpx.Client) -> None:
        assert proxied.get("/api/v1/nodes").status_code == 401
