"""Evaluation of judged results (alerts mode): Prometheus decided `for` and `keep_firing_for`."""

from __future__ import annotations

from datetime import timedelta

from healer.engine.evaluation import AlertState, ChangeKind, EvaluationState, QueryResult, Sample, evaluate
from healer.model.states import FindingState
from tests.unit.test_evaluation import HOT, KEY, T0, rule, ruleset

GPU_TOO_HOT = rule(for_=300, keep=600)


def judged(*alerts: AlertState, value: float = 84.0) -> QueryResult:
    return QueryResult(samples=[Sample(labels=HOT, value=value, alert=a) for a in alerts], judged=True)


def tick(outcome: QueryResult, state: EvaluationState, at: float) -> tuple[EvaluationState, list[ChangeKind]]:
    ev = evaluate(
        ruleset=ruleset(GPU_TOO_HOT),
        results={GPU_TOO_HOT.name: outcome},
        previous=state,
        now=T0 + timedelta(seconds=at),
    )
    return ev.state, [c.kind for c in ev.changes]


def test_firing_alert_is_firing_on_healers_first_look_since_prometheus_activeat() -> None:
    active = T0 - timedelta(minutes=7)
    state, changes = tick(judged(AlertState(firing=True, active_at=active)), EvaluationState(), 0)
    finding = state.series[KEY]
    assert changes == [ChangeKind.FIRED]
    assert finding.state == FindingState.FIRING
    assert finding.active_since == active and finding.fired_at == T0
    assert finding.summary == "GPU 3 at 84 C"


def test_pending_until_prometheus_says_firing_whatever_healers_clock_says() -> None:
    pending = AlertState(firing=False, active_at=T0 - timedelta(hours=1))  # `for` long past here
    state, changes = tick(judged(pending), EvaluationState(), 0)
    assert changes == [ChangeKind.PENDING] and state.series[KEY].state == FindingState.PENDING
    state, changes = tick(judged(pending), state, 30)
    assert changes == [ChangeKind.UPDATED] and state.series[KEY].state == FindingState.PENDING
    state, changes = tick(judged(AlertState(firing=True, active_at=pending.active_at)), state, 60)
    assert changes == [ChangeKind.FIRED] and state.series[KEY].fired_at == T0 + timedelta(seconds=60)


def test_keep_firing_runs_in_prometheus_not_twice() -> None:
    firing = AlertState(firing=True, active_at=T0)
    state, _ = tick(judged(firing), EvaluationState(), 0)
    clear_since = T0 + timedelta(seconds=30)
    held = AlertState(firing=True, active_at=T0, keep_firing_since=clear_since)
    state, changes = tick(judged(held), state, 60)
    finding = state.series[KEY]
    assert changes == [ChangeKind.UPDATED]
    assert finding.state == FindingState.FIRING and finding.clear_since == clear_since
    assert finding.last_true_at == T0  # clear since then: not refreshed while held
    # Prometheus resolved it (its keep_firing_for ran out): resolved now, no second hold here.
    state, changes = tick(judged(), state, 90)
    assert changes == [ChangeKind.RESOLVED] and KEY not in state.series


def test_a_firing_episode_seen_pending_again_stays_firing() -> None:
    state, _ = tick(judged(AlertState(firing=True, active_at=T0)), EvaluationState(), 0)
    state, changes = tick(judged(AlertState(firing=False, active_at=T0 + timedelta(seconds=50))), state, 60)
    assert changes == [ChangeKind.UPDATED] and state.series[KEY].state == FindingState.FIRING


def unheld(*alerts: AlertState) -> QueryResult:
    """Judged by an engine that evaluated the rule without its keep_firing_for (vmalert 1.79)."""
    return QueryResult(
        samples=[Sample(labels=HOT, value=84.0, alert=a) for a in alerts],
        judged=True,
        engine_keeps_firing=False,
    )


def test_keep_firing_held_here_when_the_engine_evaluated_without_it() -> None:
    state, _ = tick(unheld(AlertState(firing=True, active_at=T0)), EvaluationState(), 0)
    # The engine dropped the alert at 60 s: healer holds it for the rule's 600 s.
    state, changes = tick(unheld(), state, 60)
    assert changes == [] and state.series[KEY].state == FindingState.FIRING
    assert state.series[KEY].clear_since == T0 + timedelta(seconds=60)
    # True again while held (the engine starts a new, pending alert): firing, hold starts over.
    state, changes = tick(unheld(AlertState(firing=False, active_at=T0 + timedelta(seconds=90))), state, 90)
    assert changes == [ChangeKind.UPDATED] and state.series[KEY].state == FindingState.FIRING
    assert state.series[KEY].clear_since is None
    state, changes = tick(unheld(), state, 120)
    state, changes = tick(unheld(), state, 120 + 599)
    assert changes == [] and KEY in state.series
    state, changes = tick(unheld(), state, 120 + 600)
    assert changes == [ChangeKind.RESOLVED] and KEY not in state.series
