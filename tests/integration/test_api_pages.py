"""The dashboard pages as a user reads them (HTML over a real uvicorn), and the operator forms."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.model.states import NodeState
from healer.store import nodes as repo
from tests.integration.test_api_support import (
    EVIL_LABEL,
    NOW,
    OPERATOR_TOKEN,
    Seeded,
    csrf_from,
    login,
    seeded_client,
)


@pytest.fixture
def served(session_factory: sessionmaker[Session]) -> Iterator[tuple[httpx.Client, Seeded]]:
    with seeded_client(session_factory) as pair:
        yield pair


@pytest.fixture
def client(served: tuple[httpx.Client, Seeded]) -> httpx.Client:
    return served[0]


def text_of(page: httpx.Response) -> str:
    """The page's text with tags removed and entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.text)).split())


class TestEscaping:
    def test_label_value_with_html_is_escaped_on_the_node_page(self, client: httpx.Client) -> None:
        page = client.get("/nodes/gpu-node-07")
        assert page.status_code == 200
        assert "<script>" not in page.text
        assert html.escape(EVIL_LABEL, quote=True).replace("&quot;", "&#34;") in page.text
        assert f'modelName="{EVIL_LABEL}"' in text_of(page)  # shown to the user as text

    def test_rejected_rule_errors_are_escaped(self, client: httpx.Client) -> None:
        page = client.get("/rules")
        assert "<b>bad</b>" not in page.text
        assert "&lt;b&gt;bad&lt;/b&gt;" in page.text

    def test_node_names_from_the_cluster_are_escaped(
        self, client: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        with session_factory() as s, s.begin():
            node = repo.get_or_create_node(s, 'n"><img src=x onerror=alert(1)>', now=NOW)
            repo.transition(s, node, NodeState.SUSPECT, now=NOW, actor="healer", reason="<i>why</i>")
        page = client.get("/")
        assert "<img src=x" not in page.text
        assert "&lt;img src=x onerror=alert(1)&gt;" in page.text


class TestFleet:
    def test_overview(self, client: httpx.Client) -> None:
        page = client.get("/")
        assert page.status_code == 200
        text = text_of(page)
        assert "1 quarantined" in text and "1 awaiting_repair" in text and "3 healthy" in text
        assert "tripped" in text and "6 nodes went bad in 300s" in text
        assert "dry-run" in text
        assert "2026-03-01 11:59:40Z (20s ago, took 0.80 s, by healer-0)" in text
        assert "h100 2 2 1" in text  # pool, nodes, out of service, limit (the floor for small pools: 1)
        assert "XidFatal error" in text and "GpuTooHot ok" in text

    def test_a_node_quarantined_by_taint_alone_is_shown_tainted(
        self, client: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        with session_factory() as s, s.begin():
            node = repo.get_or_create_node(s, "gpu-node-taint", now=NOW, pool="h100")
            incident = repo.ensure_incident(s, node, now=NOW, summary="Throttled firing")
            incident.cordoned_by_healer = False
            incident.expect_unschedulable = False
            repo.transition(s, node, NodeState.QUARANTINED, now=NOW, actor="healer", reason="tainted")
        text = text_of(client.get("/"))
        assert "gpu-node-taint h100 tainted" in text
        assert "gpu-node-07 h100 quarantined" in text  # cordoned and tainted: still quarantined

    def test_unhealthy_table(self, client: httpx.Client) -> None:
        text = text_of(client.get("/"))
        assert "gpu-node-07 h100 quarantined 55m 0s ago GpuTooHot 3 default: pending" in text
        assert "gpu-node-20" not in text  # healthy nodes are not listed

    @pytest.mark.parametrize(
        ("query", "shown", "hidden"),
        [
            ("state=blocked", "gpu-node-11", "gpu-node-07"),
            ("pool=h100", "gpu-node-03", "gpu-node-11"),
            ("rule=XidFatal", "gpu-node-03", "gpu-node-07"),
            ("q=node-0", "gpu-node-07", "gpu-node-11"),
            ("state=healthy", "gpu-node-20", "gpu-node-07"),
        ],
    )
    def test_filters(self, client: httpx.Client, query: str, shown: str, hidden: str) -> None:
        table = client.get(f"/?{query}").text.split('data-testid="nodes"')[1]
        assert shown in table and hidden not in table

    def test_pagination_links(self, client: httpx.Client, session_factory: sessionmaker[Session]) -> None:
        with session_factory() as s, s.begin():
            for i in range(60):
                node = repo.get_or_create_node(s, f"extra-{i:02d}", now=NOW)
                repo.transition(s, node, NodeState.SUSPECT, now=NOW, actor="healer", reason="x")
        first = client.get("/?state=suspect")
        assert first.text.count('href="/nodes/extra-') == 50
        next_link = html.unescape(first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0])
        second = client.get(next_link)
        assert second.text.count('href="/nodes/extra-') == 10
        assert "First page" in second.text and 'rel="next"' not in second.text


class TestNodePage:
    def test_shows_everything_about_the_node(self, client: httpx.Client) -> None:
        page = client.get("/nodes/gpu-node-07")
        text = text_of(page)
        assert "2026-03-01 11:05:00Z suspect → quarantined by healer : GpuTooHot firing for 5m" in text
        assert "GpuTooHot GPU 3 above 78 C firing 3 85.5 degrees C" in text
        assert "cordon dry_run healer" in text
        assert "HTTP 503: provider unavailable" in text
        assert "GPU-0000-3 NVIDIA H100 80GB HBM3 00000000:15:00.0" in text
        assert "Incident #" in text and "GPU 3 too hot" in text

    def test_chart_failure_is_a_note_not_an_error(self, client: httpx.Client) -> None:
        page = client.get("/nodes/gpu-node-07")
        assert page.status_code == 200
        assert 'data-testid="chart-unavailable"' in page.text
        assert "Metrics unavailable" in text_of(page)

    def test_unknown_node_is_a_404_page(self, client: httpx.Client) -> None:
        page = client.get("/nodes/nope")
        assert page.status_code == 404
        assert "unknown node 'nope'" in text_of(page)


class TestOtherPages:
    def test_tickets(self, client: httpx.Client) -> None:
        text = text_of(client.get("/tickets"))
        assert "gpu-node-03 default acknowledged RMA-42 1d 0h 4h 0m" in text
        assert "HTTP 503: provider unavailable" in text
        assert "default 2" in text  # two open tickets for the provider

    def test_rules(self, client: httpx.Client) -> None:
        text = text_of(client.get("/rules"))
        assert "Rejected reload" in text
        assert "XidFatal expr DCGM_FI_DEV_XID_ERRORS == 79 gpu-thermal error bad_data: parse error" in text
        assert "GpuTooHot" in text and "quarantine, ticket" in text
        assert "Rule set loaded at 2026-02-28 12:00:00Z from rules/gpu" in text  # as every time on the pages

    def test_audit_filters_and_shows_refusals(self, client: httpx.Client) -> None:
        text = text_of(client.get("/audit?status=refused"))
        assert "quarantine gpu-node-11 refused healer budget: 2 of 2 nodes of pool a100 already out" in text
        assert "cordon" not in text.split("Nothing recorded")[0].split("Error / detail")[1]


class TestOperatorForms:
    def test_release_with_confirmation(self, client: httpx.Client) -> None:
        login(client, OPERATOR_TOKEN)
        confirm = client.get("/nodes/gpu-node-07/release")
        assert confirm.status_code == 200
        assert 'name="confirm"' in confirm.text and "Release node" in confirm.text
        r = client.post(
            "/nodes/gpu-node-07/release",
            data={"csrf_token": csrf_from(confirm.text), "confirm": "yes", "reason": "reseated GPU 3"},
        )
        assert r.status_code == 303 and r.headers["location"] == "/nodes/gpu-node-07?done=release"
        page = text_of(client.get(r.headers["location"]))
        assert "Release requested: healer moves the node to validating at its next tick" in page
        audit = text_of(client.get("/audit?kind=release"))
        assert "release gpu-node-07 pending alice" in audit

    def test_release_of_a_healthy_node_explains_why_not(self, client: httpx.Client) -> None:
        csrf = login(client, OPERATOR_TOKEN)
        r = client.post("/nodes/gpu-node-20/release", data={"csrf_token": csrf, "confirm": "yes"})
        assert r.status_code == 409
        assert "node gpu-node-20 is healthy" in text_of(r)

    def test_note(self, client: httpx.Client) -> None:
        csrf = login(client, OPERATOR_TOKEN)
        r = client.post(
            "/nodes/gpu-node-07/note",
            data={"csrf_token": csrf, "confirm": "yes", "text": "<b>vendor</b> tue"},
        )
        assert r.status_code == 303
        page = client.get("/nodes/gpu-node-07")
        assert "alice : <b>vendor</b> tue" in text_of(page)
        assert "<b>vendor</b>" not in page.text

    def test_pause_resume_breaker(self, client: httpx.Client) -> None:
        csrf = login(client, OPERATOR_TOKEN)
        for action in ("pause", "resume", "breaker-reset"):
            assert client.get(f"/controls/{action}").status_code == 200
            r = client.post(f"/controls/{action}", data={"csrf_token": csrf, "confirm": "yes"})
            assert r.status_code == 303, (action, r.text)
        text = text_of(client.get("/"))
        assert "Circuit breaker closed" in text and "Pause running" in text
        assert client.get("/controls/explode").status_code == 404

    def test_close_ticket(self, served: tuple[httpx.Client, Seeded]) -> None:
        client, ids = served
        csrf = login(client, OPERATOR_TOKEN)
        assert "Close ticket" in client.get(f"/tickets/{ids.acked_ticket_id}/close").text
        r = client.post(f"/tickets/{ids.acked_ticket_id}/close", data={"csrf_token": csrf, "confirm": "yes"})
        assert r.status_code == 303
        assert "closed by alice" in text_of(client.get("/tickets"))

    def test_viewer_cannot_open_confirmation_pages(self, client: httpx.Client) -> None:
        assert client.get("/nodes/gpu-node-07/release").status_code == 403
        assert client.get("/controls/pause").status_code == 403


def test_the_topology_page_without_a_topology_says_so_and_an_unknown_domain_incident_is_404(
    client: httpx.Client,
) -> None:
    page = client.get("/topology")
    assert page.status_code == 200
    assert "No topology: no node carries a domain label" in text_of(page)
    assert 'href="/topology" aria-current="page"' in page.text
    assert client.get("/api/v1/topology").json() == {"kinds": {}, "incidents": []}
    assert client.get("/domains/999").status_code == 404
    missing = client.get("/api/v1/domains/999")
    assert (missing.status_code, missing.json()["error"]["message"]) == (404, "no domain incident 999")


def test_the_burst_page_without_capacity_rules_says_so(client: httpx.Client) -> None:
    page = client.get("/burst")
    assert page.status_code == 200
    assert "No burst observed yet" in text_of(page)
    assert 'href="/burst" aria-current="page"' in page.text
    assert client.get("/api/v1/burst").json() == {
        "observed_at": None,
        "rules": [],
        "history": [],
        "returns": [],
    }
