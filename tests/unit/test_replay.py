"""The replay: ticks of query results through evaluation, lifecycle and safety, in memory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from healer.engine.backtest import compare, summarize
from healer.engine.evaluation import QueryResult, Sample
from healer.engine.replay import EventKind, Replay, ReplaySettings
from healer.model.limits import SafetyLimits
from healer.model.states import NodeState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet

T0 = datetime(2026, 11, 30, tzinfo=UTC)
STEP = timedelta(seconds=30)


def rules(for_: float = 60) -> RuleSet:
    return RuleSet(
        groups=(
            RuleGroup(
                name="g",
                rules=[
                    Rule(
                        name="Hot",
                        expr="t > 78",
                        for_=for_,
                        actions=["quarantine", {"drain": {"timeout": "1h"}}, {"ticket": {"provider": "p"}}],
                    )
                ],
            ),
        )
    )


def hot(*nodes: str) -> dict[str, QueryResult]:
    return {"Hot": QueryResult(samples=[Sample({"Hostname": n, "gpu": "0"}, 90.0) for n in nodes])}


def run(ticks: list[dict[str, QueryResult]], settings: ReplaySettings, fleet: list[str]) -> Replay:
    replay = Replay(rules(), settings)
    for i, results in enumerate(ticks):
        replay.tick(T0 + i * STEP, results, fleet=fleet)
    return replay


FLEET = [f"n{i}" for i in range(20)]
WIDE = SafetyLimits(max_unhealthy=100, max_unhealthy_percent=100, breaker_nodes=100, breaker_percent=100)


def test_a_held_finding_is_quarantined_drained_and_ticketed_in_order() -> None:
    replay = run([hot("n1")] * 4, ReplaySettings(limits=WIDE), FLEET)
    kinds = [(e.kind, e.at - T0) for e in replay.result().events if e.node == "n1"]
    assert kinds == [
        (EventKind.FIRED, 2 * STEP),
        (EventKind.QUARANTINE, 2 * STEP),
        (EventKind.DRAIN, 2 * STEP),
        (EventKind.TICKET, 3 * STEP),
    ]
    assert replay.state_of("n1") == NodeState.AWAITING_REPAIR


def test_the_breaker_trips_on_a_wave_and_holds_every_new_quarantine() -> None:
    limits = SafetyLimits(max_unhealthy=100, max_unhealthy_percent=100, breaker_nodes=3, breaker_percent=100)
    wave = hot("n1", "n2", "n3", "n4")
    replay = run([wave] * 3, ReplaySettings(limits=limits), FLEET)
    result = replay.result()
    assert [e.kind for e in result.events if e.node == ""] == [EventKind.BREAKER_TRIP]
    held = {e.node for e in result.events if e.kind == EventKind.HELD_BREAKER}
    assert held == {"n1", "n2", "n3", "n4"}
    assert not [e for e in result.events if e.kind == EventKind.QUARANTINE]


def test_node_hours_and_a_comparison() -> None:
    ticks = [hot("n1")] * 121  # one hour at 30 s
    end = T0 + 120 * STEP
    a = summarize(
        run(ticks, ReplaySettings(limits=WIDE), FLEET).result(),
        rules=["Hot"],
        start=T0,
        end=end,
        step_seconds=30,
    )
    b_replay = Replay(rules(for_=7200), ReplaySettings(limits=WIDE))
    for i, results in enumerate(ticks):
        b_replay.tick(T0 + i * STEP, results, fleet=FLEET)
    b = summarize(b_replay.result(), rules=["Hot"], start=T0, end=end, step_seconds=30, label="slow")
    hot_a = a.rule("Hot")
    assert hot_a is not None and hot_a.nodes_out == 1
    assert abs(hot_a.node_hours - (3600 - 60) / 3600) < 1e-9  # out from 1:00 (for: 1m) to the end
    delta = compare(a, b).rules[0]
    assert delta.only_a == ("n1",) and delta.only_b == ()
    assert delta.nodes_out_delta == -1
