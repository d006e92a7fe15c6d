"""The dashboard in headless Chromium (Debian's ``chromium``, driven by Playwright).

One uvicorn serves the app over a seeded SQLite database; a real Prometheus scrapes a small
dcgm-exporter style endpoint for the node, so the node page's chart is drawn from real range-query
data. One browser for the module; each test gets a fresh context (no shared cookies).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from healer.model.states import NodeState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.sources.prometheus_range import PrometheusRange
from healer.store import migrate
from healer.store import nodes as repo
from healer.store.models import DomainIncident, Incident
from healer.store.session import make_engine, make_sessionmaker
from tests.integration.test_api_support import (
    EVIL_SERIAL,
    MOVED_GPU,
    OPERATOR_TOKEN,
    RULESET,
    VIEWER_TOKEN,
    build_app,
    dcgm_exporter,
    make_settings,
    seed,
    seed_parts,
    serve,
)
from tests.service_skips import require_binary
from tests.services import ScrapeTarget, prometheus_server

pytestmark = [pytest.mark.browser, pytest.mark.prometheus]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NODE = "gpu-node-07"
#: dcgm-exporter field 112 under its 4.x and 3.x names (the test exporter sends neither).
FIELD_112 = '"DCGM_FI_DEV_CLOCKS_EVENT_REASONS|DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"'


@dataclass
class Dashboard:
    url: str
    sessions: sessionmaker[Session]
    prometheus: str  # the real Prometheus's URL


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """uvicorn + seeded SQLite + a real Prometheus scraping the node's GPU metrics."""
    db = tmp_path_factory.mktemp("browser") / "healer.db"
    url = f"sqlite:///{db}"
    migrate.upgrade(url)
    engine = make_engine(url)
    factory = make_sessionmaker(engine)
    now = datetime.now(UTC)
    seed(factory, now=now)
    # A fresh incident, so the chart window is the last minute or two where Prometheus has data.
    with factory() as s, s.begin():
        s.execute(
            update(Incident)
            .where(Incident.summary == "GPU 3 too hot")
            .values(opened_at=now - timedelta(seconds=40))
        )
    try:
        with dcgm_exporter(NODE, gpus=2) as address, prometheus_server([ScrapeTarget(address)]) as prom:
            prom.wait_for_samples(f'count_over_time(DCGM_FI_DEV_GPU_TEMP{{Hostname="{NODE}"}}[1m]) >= 3')
            app = build_app(
                factory,
                make_settings(refresh_seconds=2),
                clock=lambda: datetime.now(UTC),
                prometheus=PrometheusRange(prom.url, timeout_seconds=5),
            )
            with serve(app) as base:
                yield Dashboard(url=base, sessions=factory, prometheus=prom.url)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        require_binary("chromium", package="chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()


def log_in(page: Page, base: str, token: str) -> None:
    page.goto(f"{base}/login")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_test_id("identity")).to_be_visible()


def test_fleet_to_node_page_with_timeline_and_chart(dashboard: Dashboard, page: Page, tmp_path: Path) -> None:
    page.goto(dashboard.url)
    expect(page.get_by_role("heading", name="Fleet")).to_be_visible()
    nodes = page.get_by_test_id("nodes")
    expect(nodes).to_contain_text("quarantined")
    row = nodes.locator("tr", has=page.get_by_role("link", name=NODE))
    expect(row.get_by_test_id("row-verdict")).to_contain_text("You: nothing: healer is handling it")
    nodes.get_by_role("link", name=NODE).click()

    expect(page).to_have_url(f"{dashboard.url}/nodes/{NODE}")
    expect(page.get_by_test_id("node-name")).to_have_text(NODE)
    # The verdict first: what fired (the latest value against the rule's threshold), what healer
    # did, what it waits for, and what a person should do.
    verdict = page.get_by_test_id("verdict")
    expect(verdict).to_be_visible()
    expect(page.get_by_test_id("verdict-fired")).to_contain_text(
        "GpuTooHot on GPU 3: 85.5 degrees C (threshold > 78)"
    )
    expect(page.get_by_test_id("verdict-did")).to_contain_text("asked default for a repair")
    expect(page.get_by_test_id("verdict-waiting")).not_to_be_empty()
    expect(page.get_by_test_id("verdict-human")).to_have_text("nothing: healer is handling it")
    # The incident's headline is its latest evidence, not the words it opened with.
    expect(page.get_by_test_id("incident-headline")).to_contain_text("value 85.5 degrees C")
    timeline = page.get_by_test_id("timeline")
    expect(timeline).to_contain_text("GpuTooHot firing for 5m")
    expect(timeline).to_contain_text("suspect")
    chart = page.get_by_test_id("chart")
    # The input series of the rule that fired (GpuTooHot reads GPU temperature), narrowed to this
    # node, with its threshold.
    expect(chart.locator("svg")).to_have_count(1)
    expect(chart.locator("figure.chart")).to_have_attribute(
        "data-series", f'max by (Hostname, gpu, UUID)(DCGM_FI_DEV_GPU_TEMP{{Hostname="{NODE}"}})'
    )
    expect(chart.locator("path.series")).to_have_count(2)  # 2 GPUs
    expect(chart.get_by_test_id("threshold")).to_have_count(1)
    expect(chart).to_contain_text("threshold > 78")
    d = chart.locator("path.series").first.get_attribute("d") or ""
    assert d.startswith("M") and " L" in d, d
    chart.screenshot(path=str(tmp_path / "node-chart.png"))
    # The HTML label value is shown as text, not run.
    expect(page.get_by_test_id("findings")).to_contain_text('modelName="<script>alert("x")</script>"')


def test_viewer_is_refused_a_release(dashboard: Dashboard, page: Page) -> None:
    log_in(page, dashboard.url, VIEWER_TOKEN)
    expect(page.get_by_test_id("identity")).to_contain_text("victor")
    page.goto(f"{dashboard.url}/nodes/{NODE}")
    page.get_by_test_id("release").click()
    expect(page.get_by_role("alert")).to_contain_text("needs the operator role")
    page.goto(f"{dashboard.url}/nodes/{NODE}")
    expect(page.get_by_test_id("node-state")).to_have_text("quarantined")


def test_operator_releases_the_node(dashboard: Dashboard, page: Page) -> None:
    log_in(page, dashboard.url, OPERATOR_TOKEN)
    page.goto(f"{dashboard.url}/nodes/{NODE}")
    expect(page.get_by_test_id("node-state")).to_have_text("quarantined")
    page.get_by_test_id("release").click()

    expect(page.get_by_role("heading", name="Release node")).to_be_visible()
    page.get_by_label("Reason").fill("GPU 3 reseated")
    page.get_by_role("checkbox").check()
    page.get_by_role("button", name="Release").click()

    expect(page).to_have_url(f"{dashboard.url}/nodes/{NODE}?done=release")
    # A request: the controller's next tick moves the node (one writer of node state).
    expect(page.get_by_role("status")).to_contain_text("Release requested")
    expect(page.get_by_test_id("node-state")).to_have_text("quarantined")
    page.goto(f"{dashboard.url}/audit?kind=release")
    expect(page.locator("main")).to_contain_text("pending")
    expect(page.locator("main")).to_contain_text("GPU 3 reseated")


def test_fleet_page_shows_attention_first_and_refreshes_in_place(
    dashboard: Dashboard, page: Page, tmp_path: Path
) -> None:
    page.goto(dashboard.url)
    attention = page.get_by_test_id("attention")
    expect(attention).to_be_visible()
    headings = page.locator("#fleet-live h2").all_inner_texts()
    assert headings[0] == "Needs attention", headings
    assert (
        headings.index("Remediation budget") < headings.index("Nodes not healthy") < headings.index("Rules")
    )
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    with dashboard.sessions() as s, s.begin():
        node = repo.get_or_create_node(s, "gpu-node-42", now=datetime.now(UTC), pool="h100")
        incident = repo.ensure_incident(s, node, now=datetime.now(UTC), summary="XidFatal firing")
        incident.blocked_reason = "pool h100 at its budget (2 of 2 out of service)"
        repo.transition(s, node, NodeState.BLOCKED, now=datetime.now(UTC), actor="healer", reason="refused")

    row = attention.locator('tr[data-node="gpu-node-42"]')
    expect(row).to_contain_text("blocked", timeout=15_000)
    expect(row).to_contain_text("pool h100 at its budget")
    assert page.evaluate("window.__sameDocument") is True  # refreshed without a full reload
    # Blocked first, then awaiting repair past the limit, then unknown.
    states = [t.strip() for t in attention.locator("tbody tr td:nth-child(3)").all_inner_texts()]
    rank = {"blocked": 0, "awaiting_repair": 1, "unknown": 2}
    assert "blocked" in states and [rank[x] for x in states] == sorted(rank[x] for x in states), states
    shot = tmp_path / "fleet.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_rules_page_flags_a_rule_whose_metric_no_target_exports(dashboard: Dashboard, page: Page) -> None:
    """The exporter sends GPU temperatures but not field 112: the rule reading it is flagged where
    the eye goes (a panel on top and its own row), the rule reading temperatures is not."""
    blind = Rule.model_validate(
        {
            "name": "GpuHardwareSlowdown",
            "expr": f"max by (Hostname, gpu) ({{__name__=~{FIELD_112}}}) > 0",
        }
    )
    ruleset = RuleSet(groups=(RuleGroup(name="g", rules=[*RULESET.rules, blind]),))
    app = build_app(
        dashboard.sessions,
        clock=lambda: datetime.now(UTC),
        ruleset_provider=lambda: ruleset,
        prometheus=PrometheusRange(dashboard.prometheus, timeout_seconds=5),
    )
    with serve(app) as base:
        page.goto(f"{base}/rules")
        panel = page.get_by_test_id("inputs-absent")
        expect(panel).to_be_visible()
        expect(panel).to_contain_text("1 rule reads a metric no target exports")
        expect(panel).to_contain_text(
            "GpuHardwareSlowdown: DCGM_FI_DEV_CLOCKS_EVENT_REASONS or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
        )
        row = page.get_by_role("row").filter(has=page.get_by_role("link", name="GpuHardwareSlowdown"))
        expect(row.get_by_test_id("rule-inputs-absent")).to_be_visible()
        hot = page.get_by_role("row").filter(has=page.get_by_role("link", name="GpuTooHot", exact=True))
        expect(hot.get_by_test_id("rule-inputs-absent")).to_have_count(0)


def test_parts_page_flags_a_repeat_part_and_leads_to_its_node(dashboard: Dashboard, page: Page) -> None:
    """A GPU repaired on one node fails again on another: the Parts page (from the nav) lists it
    first, flagged, and its node's page carries the flag with the GPU's UUID, serial and where it
    failed."""
    seed_parts(dashboard.sessions, now=datetime.now(UTC))
    page.goto(dashboard.url)
    page.get_by_role("navigation").get_by_role("link", name="Parts").click()
    expect(page.get_by_role("heading", name="Parts", exact=True)).to_be_visible()
    expect(page.get_by_test_id("repeat-parts-alarm")).to_contain_text("1 repeat part")
    first = page.get_by_test_id("parts").locator("tbody tr").first
    expect(first.get_by_test_id("part-id")).to_have_text(MOVED_GPU)
    expect(first.get_by_test_id("repeat-flag")).to_be_visible()
    expect(first).to_contain_text(EVIL_SERIAL)  # the exporter's label, shown as text
    expect(page.get_by_test_id("repair-steps")).to_contain_text("100%")

    first.get_by_role("link", name="gpu-node-b2").first.click()
    expect(page.get_by_test_id("node-name")).to_have_text("gpu-node-b2")
    flag = page.get_by_test_id("repeat-part")
    expect(flag).to_be_visible()
    expect(flag).to_contain_text(f"Repeat part: this node holds GPU {MOVED_GPU} (serial {EVIL_SERIAL})")
    expect(flag.get_by_role("link", name="gpu-node-a1")).to_be_visible()
    assert page.locator("b", has_text="sn-1650").count() == 0


def seed_domain(sessions: sessionmaker[Session], *, now: datetime) -> int:
    """leaf-a's 4 nodes (NODE among them) under one open domain incident, leaf-b healthy; returns
    the incident's id."""
    leaf_a = [NODE, "gpu-node-a2", "gpu-node-a3", "gpu-node-a4"]
    with sessions() as s, s.begin():
        for name in [*leaf_a[1:], "gpu-node-b1"]:
            node = repo.get_or_create_node(s, name, now=now)
            node.state = NodeState.AWAITING_REPAIR if name in leaf_a else NodeState.HEALTHY
        repo.set_switch(
            s,
            repo.SWITCH_TOPOLOGY,
            {"domains": {"ib_leaf": {"leaf-a": leaf_a, "leaf-b": ["gpu-node-b1"]}}},
            now=now,
            by="healer",
        )
        row = DomainIncident(
            kind="ib_leaf",
            name="leaf-a",
            size=4,
            first_seen=now - timedelta(minutes=3),
            opened_at=now - timedelta(minutes=2),
            summary="4 of 4 node(s) of ib_leaf leaf-a turned bad within 300 s",
            members=[{"node": n, "joined_at": now.isoformat()} for n in leaf_a],
            evidence={"min_nodes": 3, "min_percent": 10, "window_seconds": 300, "needed": 3, "rules": []},
        )
        s.add(row)
        s.flush()
        member = repo.get_or_create_node(s, "gpu-node-a2", now=now)
        linked = repo.new_incident(s, member, now=now, summary="GPU 1 link down")
        linked.domain_incident_id = row.id
        return row.id


def test_topology_grid_leads_to_the_domain_incident_and_its_nodes(dashboard: Dashboard, page: Page) -> None:
    """The Topology page (from the nav) colours leaf-a red with its open incident, leaf-b green;
    the incident's page lists its four member nodes, each a link to the node."""
    incident = seed_domain(dashboard.sessions, now=datetime.now(UTC))
    page.goto(dashboard.url)
    page.get_by_role("navigation").get_by_role("link", name="Topology").click()
    expect(page.get_by_role("heading", name="Topology", exact=True)).to_be_visible()
    leaf_a = page.locator('[data-kind="ib_leaf"] [data-domain="leaf-a"]')
    expect(leaf_a).to_have_attribute("data-health", "bad")
    expect(leaf_a.locator(".cell-bad")).to_have_count(4)
    expect(page.locator('[data-domain="leaf-b"]')).to_have_attribute("data-health", "ok")
    expect(page.get_by_test_id("domain-incidents")).to_contain_text("4 of 4")

    leaf_a.get_by_role("link", name=f"incident {incident}").click()
    expect(page.get_by_role("heading", name=f"Domain incident {incident}: ib_leaf leaf-a")).to_be_visible()
    expect(page.get_by_test_id("domain-threshold")).to_contain_text("3 node(s)")
    members = page.get_by_test_id("domain-members").locator("tbody tr")
    expect(members).to_have_count(4)
    page.get_by_test_id("domain-members").get_by_role("link", name="gpu-node-a2").click()
    expect(page.get_by_test_id("node-name")).to_have_text("gpu-node-a2")
    banner = page.get_by_test_id("node-domain")
    expect(banner).to_contain_text("ib_leaf leaf-a, 4 of 4 node(s); no replacement ticket of its own")
    banner.get_by_role("link", name=f"domain incident {incident}").click()
    expect(page.get_by_role("heading", name=f"Domain incident {incident}: ib_leaf leaf-a")).to_be_visible()
