"""The demo's faults, as an on-call sees them in Chromium, at 1440 and 390 px wide.

Everything the pages show is real: the fleet simulator serves the packaged demo scenario
(``healer_dev/simulator/scenarios/demo.yaml``) at twelve times real time, a real Prometheus
scrapes the faulty nodes every second, and healer's detection (the default rule pack, holds cut to
2 s) records its findings in SQLite tick by tick, as the controller would. Each faulty node then
gets the incident the controller would open (its rule, a cordon), so the node page has its
verdict, spans and decisions.

For each fault the node page's chart must draw the rule's **input series** for that node (not the
rule's filtered result), with its threshold (a dashed line, or the dashed threshold series of a
rule that compares two series); and no page may be wider than a 390 px phone. Screenshots of each
page at both widths are left in the test's tmp directory.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from healer.detection import run_detection
from healer.engine.evaluation import EvaluationState
from healer.model.states import NodeState
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import RuleSet
from healer.sources.prometheus import PrometheusSource
from healer.sources.prometheus_range import PrometheusRange
from healer.store import migrate
from healer.store import nodes as repo
from healer.store.models import Incident
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.simulator import ElapsedClock, Fleet, FleetConfig, Scenario, SimulatorServer, parse_scenario
from tests.browser.test_dashboard_browser import CHROMIUM_ARGS, browser  # noqa: F401 (fixture)
from tests.integration.test_alerts_mode_prometheus import shortened_rules
from tests.integration.test_api_support import build_app, make_settings, serve
from tests.services import prometheus_server, simulator_targets

pytestmark = [pytest.mark.browser, pytest.mark.prometheus]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "healer_dev/simulator/scenarios/demo.yaml"
SPEED = 12.0
#: The demo's faults healer acts on (demo.yaml), the rule each one fires, and the metric the
#: chart's input series must read. gpu-node-07's hot GPU is charted with GpuTooHot's 78 C line.
FAULTS = {
    "gpu-node-07": ("GpuTooHot", "DCGM_FI_DEV_GPU_TEMP"),
    "gpu-node-12": ("GpuFatalXid", "DCGM_FI_DEV_XID_ERRORS"),
    "gpu-node-23": ("NvlinkErrorBurst", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    "gpu-node-31": ("InfinibandLinkDowned", "node_infiniband_link_downed_total"),
    "gpu-node-40": ("GpuSilentThrottling", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
}
HEALTHY = "gpu-node-03"
PHONE: ViewportSize = {"width": 390, "height": 844}
DESKTOP: ViewportSize = {"width": 1440, "height": 900}


@dataclass
class Demo:
    url: str
    sessions: sessionmaker[Session]
    ruleset: RuleSet


def demo_scenario() -> Scenario:
    """The packaged demo. Its GPU 5 of gpu-node-12 falls off the bus 30 s after its Xid 79: at
    twelve times real time that is 2.5 s, long enough for a 1 s scrape to see the Xid."""
    return parse_scenario(DEMO.read_text())


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp = tmp_path_factory.mktemp("demo-faults")
    ruleset = load_ruleset([shortened_rules(tmp / "rules")])
    db = f"sqlite:///{tmp / 'healer.db'}"
    migrate.upgrade(db)
    engine = make_engine(db)
    factory = make_sessionmaker(engine)
    fleet = Fleet(FleetConfig(nodes=51), demo_scenario())
    clock = ElapsedClock(speed=SPEED)
    try:
        with SimulatorServer(fleet, clock=clock) as sim:
            nodes = [*FAULTS, HEALTHY]
            targets = simulator_targets(fleet.targets(sim.address, nodes=nodes), sim.address)
            with prometheus_server(targets) as prom:
                prom.wait_for_targets_up(len(targets))
                clock.restart()
                state = EvaluationState()
                wanted = {(rule, node) for node, (rule, _) in FAULTS.items()}
                fired: set[tuple[str, str]] = set()
                with PrometheusSource(prom.url, timeout_seconds=5, tick_deadline_seconds=20) as source:
                    # Tick as the controller does until every fault's rule fired (the scenario's
                    # last one, the InfiniBand flap, starts 2 minutes in: 10 s here).
                    deadline = time.monotonic() + 90
                    while not wanted <= fired and time.monotonic() < deadline:
                        result = run_detection(
                            ruleset=ruleset,
                            source=source,
                            session_factory=factory,
                            state=state,
                            now=datetime.now(UTC),
                        )
                        state = result.state
                        now_firing = {(f.rule, f.node) for fs in result.findings.firing.values() for f in fs}
                        # Each fault's incident opens at the tick its rule first fires, as the
                        # controller's would: its finding may resolve before the last fault fires.
                        for rule, node in sorted((now_firing & wanted) - fired):
                            _open_incident(factory, node, rule)
                        fired |= now_firing
                        time.sleep(0.5)
                assert wanted <= fired, sorted(wanted - fired)
                _close_healthy_incident(factory)
                app = build_app(
                    factory,
                    make_settings(refresh_seconds=30),
                    clock=lambda: datetime.now(UTC),
                    ruleset_provider=lambda: ruleset,
                    prometheus=PrometheusRange(prom.url, timeout_seconds=5),
                )
                with serve(app) as base:
                    yield Demo(url=base, sessions=factory, ruleset=ruleset)
    finally:
        engine.dispose()


def _open_incident(factory: sessionmaker[Session], name: str, rule: str) -> None:
    """What the controller records when ``rule`` fires on node ``name``: an incident following the
    rule, its findings hung on it, the node quarantined with a cordon."""
    now = datetime.now(UTC)
    with factory() as s, s.begin():
        node = repo.get_or_create_node(s, name, now=now)
        incident = repo.ensure_incident(s, node, now=now, summary=f"{rule} firing")
        s.execute(update(Incident).where(Incident.id == incident.id).values(rule=rule))
        repo.attach_findings(s, node, incident)
        repo.transition(
            s,
            node,
            NodeState.QUARANTINED,
            now=now,
            actor="healer",
            reason=f"{rule} firing",
            incident=incident,
        )
        repo.record_action(
            s, kind="cordon", status="succeeded", actor="healer", now=now, node=node, incident=incident
        )


def _close_healthy_incident(factory: sessionmaker[Session]) -> None:
    """The healthy node's closed incident, which stays on the fleet page."""
    now = datetime.now(UTC)
    with factory() as s, s.begin():
        healthy = repo.get_or_create_node(s, HEALTHY, now=now)
        repo.ensure_incident(s, healthy, now=now, summary="GpuTooHot firing")
        repo.close_incident(s, healthy, now=now, reason="returned to service")


def _no_sideways_scroll(page: Page, width: int) -> None:
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"{page.url} is {scroll} px wide on a {width} px screen"


@pytest.fixture
def phone(browser: Browser) -> Iterator[Page]:  # noqa: F811
    context = browser.new_context(viewport=PHONE, device_scale_factor=1, is_mobile=True, has_touch=True)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def desktop(browser: Browser) -> Iterator[Page]:  # noqa: F811
    context = browser.new_context(viewport=DESKTOP)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.mark.parametrize("node", list(FAULTS))
def test_each_fault_charts_the_rules_input_series_and_threshold(
    demo: Demo, desktop: Page, node: str, tmp_path: Path
) -> None:
    rule, metric = FAULTS[node]
    desktop.goto(f"{demo.url}/nodes/{node}")
    expect(desktop.get_by_test_id("node-name")).to_have_text(node)
    panel = desktop.locator(f'figure.chart[data-rule="{rule}"]')
    expect(panel).to_have_count(1)
    series = panel.get_attribute("data-series") or ""
    # The rule's input series, read for this node only: not the fleet's, not the filtered result.
    assert metric in series, series
    assert re.search(rf'(Hostname|node)="{node}"', series), series
    assert not re.search(r"\s(>|<|>=|<=|unless)\s", series), series
    lines = panel.locator("path.series:not(.threshold-series)")
    expect(lines.first).to_be_attached()
    assert " L" in (lines.first.get_attribute("d") or ""), "the input series is drawn as a line"
    expect(panel.get_by_test_id("threshold").first).to_be_attached()
    title = panel.locator("figcaption strong")
    unit = demo.ruleset.rule(rule).unit or ""
    expect(title).to_have_text(f"{rule}: {unit}")
    # The firing span is shaded and the cordon is marked.
    expect(panel.get_by_test_id("band-firing").first).to_be_attached()
    expect(panel.get_by_test_id("decision")).to_contain_text("cordon")
    # What the on-call reads first: the verdict names the rule; the way on: kubectl and the query.
    expect(desktop.get_by_test_id("verdict-fired")).to_contain_text(rule)
    expect(desktop.get_by_test_id("kubectl")).to_contain_text(f"kubectl describe node {node}")
    # The last time label ends inside the plot (anchored at its end), so none is cut.
    assert panel.locator("svg .grid text[text-anchor=end]").last.get_attribute("text-anchor") == "end"
    desktop.screenshot(path=str(tmp_path / f"{node}-1440.png"), full_page=True)


def test_the_hot_gpu_chart_shows_the_climb_not_only_values_above_78(demo: Demo, desktop: Page) -> None:
    desktop.goto(f"{demo.url}/nodes/gpu-node-07")
    panel = desktop.locator('figure.chart[data-rule="GpuTooHot"]')
    expect(panel.locator("path.series")).to_have_count(8)  # every GPU of the node, not only GPU 3
    expect(panel).to_contain_text("threshold > 78")
    lowest = min(float(t) for t in panel.locator("svg .grid text[text-anchor=end]").all_text_contents()[:5])
    assert lowest < 78, lowest  # the y axis reaches below the threshold: the climb is visible


@pytest.mark.parametrize("path", ["/", "/incidents", *(f"/nodes/{n}" for n in FAULTS)])
def test_no_page_is_wider_than_a_phone(
    demo: Demo, phone: Page, desktop: Page, path: str, tmp_path: Path
) -> None:
    phone.goto(f"{demo.url}{path}")
    expect(phone.locator("main h1")).to_be_visible()
    _no_sideways_scroll(phone, PHONE["width"])
    slug = path.strip("/").replace("/", "-") or "fleet"
    phone.screenshot(path=str(tmp_path / f"{slug}-390.png"), full_page=True)
    desktop.goto(f"{demo.url}{path}")
    _no_sideways_scroll(desktop, DESKTOP["width"])
    desktop.screenshot(path=str(tmp_path / f"{slug}-1440.png"), full_page=True)


def test_incidents_page_filters_and_searches(demo: Demo, desktop: Page) -> None:
    desktop.goto(f"{demo.url}/")
    # The closed incident stays on the fleet page.
    expect(desktop.get_by_test_id("recently-closed")).to_contain_text(HEALTHY)
    desktop.get_by_role("navigation").get_by_role("link", name="Incidents").click()
    table = desktop.get_by_test_id("incidents")
    expect(table.locator("tbody tr")).to_have_count(len(FAULTS) + 1)
    desktop.get_by_label("Rule").select_option("NvlinkErrorBurst")
    desktop.get_by_role("button", name="Filter").click()
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text("gpu-node-23")
    desktop.goto(f"{demo.url}/incidents?state=closed")
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text("returned to service")
    desktop.goto(f"{demo.url}/incidents")
    desktop.get_by_label("Search").fill("node-31")
    desktop.get_by_role("button", name="Filter").click()
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text("InfinibandLinkDowned")
    answer = desktop.request.get(f"{demo.url}/api/v1/incidents?rule=GpuFatalXid&state=open").json()
    assert [i["node"] for i in answer["items"]] == ["gpu-node-12"]
