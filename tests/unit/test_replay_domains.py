"""The backtest's replay correlates (healer.engine.correlation): a past storm on one switch shows
as one domain incident with one ticket, and what the budget and the breaker would have done."""

from __future__ import annotations

from healer.engine.correlation import Threshold
from healer.engine.replay import EventKind, ReplaySettings
from healer.model.limits import SafetyLimits
from healer.model.states import NodeState
from tests.unit.test_replay import FLEET, STEP, T0, hot, run

#: n0..n9 behind leaf-a, n10..n19 behind leaf-b
TOPOLOGY = {n: {"ib_leaf": "leaf-a" if int(n[1:]) < 10 else "leaf-b"} for n in FLEET}
LEAF = {"ib_leaf": Threshold(min_nodes=3, min_percent=10, window_seconds=300)}
#: the production defaults' spirit: a budget of 2 and a breaker at 6 bad nodes
LIMITS = SafetyLimits(max_unhealthy=2, max_unhealthy_percent=100, breaker_nodes=5, breaker_percent=100)
STORM = hot(*[f"n{i}" for i in range(8)])


def test_without_a_topology_a_switch_storm_trips_the_breaker_after_two_replacement_tickets() -> None:
    result = run([STORM] * 5, ReplaySettings(limits=LIMITS), FLEET).result()
    assert EventKind.BREAKER_TRIP in {e.kind for e in result.events}
    assert not [e for e in result.events if e.kind == EventKind.DOMAIN_INCIDENT]


def test_with_a_topology_the_storm_is_one_domain_incident_and_no_replacement_ticket() -> None:
    settings = ReplaySettings(limits=LIMITS, topology=TOPOLOGY, thresholds=LEAF, repair_after_seconds=300)
    ticks = [STORM] * 4 + [hot()] * 24  # the link comes back; the switch ticket resolves at 300 s
    replay = run(ticks, settings, FLEET)
    result = replay.result()
    [domain] = [e for e in result.events if e.kind == EventKind.DOMAIN_INCIDENT]
    assert domain.at == T0  # the storm's first tick: its findings are pending together
    assert "ib_leaf leaf-a: 8 of 10 node(s)" in domain.detail
    kinds = {e.kind for e in result.events}
    assert EventKind.TICKET not in kinds and EventKind.BREAKER_TRIP not in kinds
    assert EventKind.HELD_BUDGET not in kinds  # eight nodes, one budget slot
    assert len([e for e in result.events if e.kind == EventKind.QUARANTINE]) == 8
    assert len([e for e in result.events if e.kind == EventKind.RETURNED]) == 8
    assert all(replay.state_of(f"n{i}") == NodeState.HEALTHY for i in range(8))


def test_two_unrelated_nodes_in_two_domains_stay_node_incidents() -> None:
    settings = ReplaySettings(limits=LIMITS, topology=TOPOLOGY, thresholds=LEAF)
    result = run([hot("n1", "n11")] * 5, settings, FLEET).result()
    assert not [e for e in result.events if e.kind == EventKind.DOMAIN_INCIDENT]
    assert sorted(e.node for e in result.events if e.kind == EventKind.TICKET) == ["n1", "n11"]
    assert STEP  # ticks are 30 s apart: both fire at the third


def test_the_report_lists_the_storm_as_one_domain_incident() -> None:
    from datetime import timedelta

    from healer.engine.backtest import report_dict, summarize

    settings = ReplaySettings(limits=LIMITS, topology=TOPOLOGY, thresholds=LEAF)
    result = run([STORM] * 3, settings, FLEET).result()
    report = summarize(result, rules=["Hot"], start=T0, end=T0 + timedelta(minutes=1), step_seconds=30)
    [(at, what)] = report.domain_incidents
    assert at == T0 and what.startswith("ib_leaf leaf-a: 8 of 10 node(s)")
    assert report_dict(report)["domain_incidents"] == [{"at": T0.isoformat(), "domain": what}]
    assert report.breaker_trips == []
