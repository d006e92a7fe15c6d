"""Detection's records on SQLite and PostgreSQL: rule evaluations, finding episodes, nodes, GPUs,
and the state a restarted controller resumes from."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from healer.engine.evaluation import EvaluationState, QueryResult, Sample, evaluate
from healer.errors import QueryError
from healer.model.states import FindingState
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store.evaluations import (
    latest_reports,
    load_state,
    open_findings,
    record_changes,
    record_reports,
)
from healer.store.models import Finding, Gpu, Node, RuleEvaluation
from healer.store.session import transaction

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GPU3 = {
    "Hostname": "gpu-node-07",
    "gpu": "3",
    "UUID": "GPU-36f675cc-81e7-4ef5-e8e2-5d940ed90475",
    "pci_bus_id": "00000000:5D:00.0",
    "modelName": "NVIDIA H100 80GB HBM3",
}
HOT = Rule.model_validate(
    {
        "name": "GpuTooHot",
        "expr": "DCGM_FI_DEV_GPU_TEMP > 78",
        "for": "1m",
        "keep_firing_for": "1m",
        "unit": "degrees C",
        "annotations": {"summary": "GPU {{ $labels.gpu }} at {{ $value }} C"},
    }
)
XID = Rule.model_validate({"name": "GpuFatalXid", "expr": "DCGM_FI_DEV_XID_ERRORS == 79"})
RULES = RuleSet(groups=(RuleGroup(name="gpu", rules=[HOT, XID]),))


def hot(value: float, labels: dict[str, str] = GPU3) -> QueryResult:
    return QueryResult(samples=[Sample(labels=labels, value=value)])


EMPTY = QueryResult(samples=[])


class Controller:
    """Evaluate and record tick after tick, as the tick does (one transaction per tick)."""

    def __init__(self, factory: sessionmaker[Session], state: EvaluationState | None = None) -> None:
        self.factory = factory
        self.state = state or EvaluationState()

    def tick(self, at: float, **results: QueryResult | QueryError) -> None:
        now = T0 + timedelta(seconds=at)
        ev = evaluate(ruleset=RULES, results=results, previous=self.state, now=now)
        with transaction(self.factory) as s:
            record_reports(s, ev.reports)
            record_changes(s, ev.changes, now=now)
        self.state = ev.state


def rows(factory: sessionmaker[Session]) -> list[Finding]:
    with factory() as s:
        return list(s.scalars(select(Finding).order_by(Finding.id)))


def test_one_row_per_episode_updated_in_place(session_factory: sessionmaker[Session]) -> None:
    c = Controller(session_factory)
    c.tick(0, GpuTooHot=hot(80), GpuFatalXid=EMPTY)
    (row,) = rows(session_factory)
    assert (row.state, row.active_since, row.fired_at, row.value) == ("pending", T0, None, 80)
    assert row.summary == "GPU 3 at 80 C"
    for at, value in [(30, 81.0), (60, 82.0), (90, 83.5)]:
        c.tick(at, GpuTooHot=hot(value), GpuFatalXid=EMPTY)
    (row,) = rows(session_factory)
    assert row.state == "firing"
    assert row.fired_at == T0 + timedelta(seconds=60)
    assert row.value == 83.5
    assert row.last_seen_at == T0 + timedelta(seconds=90)
    assert row.summary == "GPU 3 at 83.5 C"
    assert (row.node_name, row.gpu, row.unit, row.severity) == ("gpu-node-07", "3", "degrees C", "critical")
    assert row.labels == GPU3
    # Clear: the recovery hold keeps it firing, then it resolves; the row keeps its last value.
    c.tick(120, GpuTooHot=EMPTY, GpuFatalXid=EMPTY)
    assert rows(session_factory)[0].state == "firing"
    c.tick(180, GpuTooHot=EMPTY, GpuFatalXid=EMPTY)
    (row,) = rows(session_factory)
    assert (row.state, row.resolved_at, row.value) == ("resolved", T0 + timedelta(seconds=180), 83.5)
    # A new episode is a new row.
    c.tick(210, GpuTooHot=hot(90), GpuFatalXid=EMPTY)
    assert [r.state for r in rows(session_factory)] == ["resolved", "pending"]


def test_for_zero_inserts_firing_and_dropped_pending_is_resolved(
    session_factory: sessionmaker[Session],
) -> None:
    c = Controller(session_factory)
    xid = QueryResult(samples=[Sample(labels={**GPU3, "err_code": "79"}, value=79)])
    c.tick(0, GpuTooHot=hot(80), GpuFatalXid=xid)
    c.tick(30, GpuTooHot=EMPTY, GpuFatalXid=xid)
    by_rule = {r.rule: r for r in rows(session_factory)}
    assert by_rule["GpuFatalXid"].state == "firing"
    assert by_rule["GpuFatalXid"].fired_at == T0
    assert by_rule["GpuTooHot"].state == "resolved"  # pending, then clear: never fired
    assert by_rule["GpuTooHot"].fired_at is None


def test_rule_evaluations_one_row_per_rule_per_tick(session_factory: sessionmaker[Session]) -> None:
    c = Controller(session_factory)
    orphan = Sample(labels={"instance": "10.0.0.9:9400", "gpu": "0"}, value=99)
    c.tick(
        0,
        GpuTooHot=QueryResult(samples=[Sample(GPU3, 80), orphan], warnings=["partial data"]),
        GpuFatalXid=QueryError("HTTP 400 bad_data: parse error"),
    )
    c.tick(30, GpuTooHot=hot(80), GpuFatalXid=EMPTY)
    with session_factory() as s:
        assert s.scalar(select(func.count()).select_from(RuleEvaluation)) == 4
        latest = {r.rule: r for r in latest_reports(s)}
        first = {
            r.rule: r for r in s.scalars(select(RuleEvaluation).where(RuleEvaluation.evaluated_at == T0))
        }
    assert set(latest) == {"GpuTooHot", "GpuFatalXid"}
    assert latest["GpuFatalXid"].health == "ok"
    assert first["GpuFatalXid"].health == "error"
    assert "bad_data" in (first["GpuFatalXid"].error or "")
    assert first["GpuTooHot"].series == 2
    assert first["GpuTooHot"].group == "gpu"
    warnings = first["GpuTooHot"].warnings or []
    assert warnings[0] == "partial data"
    assert "1 series without a node label" in warnings[1] and "10.0.0.9:9400" in warnings[1]


def test_nodes_and_gpus_are_recorded(session_factory: sessionmaker[Session]) -> None:
    c = Controller(session_factory)
    c.tick(0, GpuTooHot=hot(80), GpuFatalXid=EMPTY)
    c.tick(30, GpuTooHot=hot(81), GpuFatalXid=EMPTY)
    with session_factory() as s:
        (node,) = s.scalars(select(Node))
        assert (node.name, node.state) == ("gpu-node-07", "healthy")
        (gpu,) = s.scalars(select(Gpu))
        assert (gpu.uuid, gpu.index, gpu.pci_bus_id, gpu.model_name, gpu.node_id) == (
            GPU3["UUID"],
            3,
            GPU3["pci_bus_id"],
            GPU3["modelName"],
            node.id,
        )
        assert (gpu.first_seen, gpu.last_seen) == (T0, T0 + timedelta(seconds=30))


def test_nan_is_stored_as_null_and_infinity_as_is(session_factory: sessionmaker[Session]) -> None:
    c = Controller(session_factory)
    other = {**GPU3, "gpu": "4", "UUID": "GPU-other"}
    both = QueryResult(samples=[Sample(GPU3, math.nan), Sample(other, math.inf)])
    c.tick(0, GpuTooHot=both, GpuFatalXid=EMPTY)
    values = {r.gpu: r.value for r in rows(session_factory)}
    assert values == {"3": None, "4": math.inf}


def test_restart_resumes_the_for_timer(session_factory: sessionmaker[Session]) -> None:
    before = Controller(session_factory)
    before.tick(0, GpuTooHot=hot(80), GpuFatalXid=EMPTY)
    before.tick(30, GpuTooHot=hot(80), GpuFatalXid=EMPTY)
    # A new controller process: state from the database only.
    with session_factory() as s:
        state = load_state(s)
        assert [f.series_key for f in open_findings(s, node="gpu-node-07")] == list(state.series)
    (resumed,) = state.series.values()
    assert (resumed.state, resumed.active_since, resumed.node, resumed.gpu) == (
        FindingState.PENDING,
        T0,
        "gpu-node-07",
        "3",
    )
    after = Controller(session_factory, state)
    after.tick(60, GpuTooHot=hot(80), GpuFatalXid=EMPTY)  # 60 s since T0: fires now, not at 120
    (row,) = rows(session_factory)
    assert (row.state, row.fired_at) == ("firing", T0 + timedelta(seconds=60))


def test_long_label_values_and_units_are_recorded_on_both_databases(
    session_factory: sessionmaker[Session],
) -> None:
    # Label values come from exporters and can be any length; PostgreSQL enforces column sizes.
    wordy = Rule.model_validate(
        {"name": "Wordy", "expr": "x > 0", "unit": "NVLink CRC and replay errors per 10 minutes, summed"}
    )
    rules = RuleSet(groups=(RuleGroup(name="gpu", rules=[wordy]),))
    labels = {**GPU3, "gpu": "g" * 100, "pci_bus_id": "p" * 80, "modelName": "m" * 300}
    ev = evaluate(
        ruleset=rules,
        results={"Wordy": QueryResult(samples=[Sample(labels, 1.0)])},
        previous=EvaluationState(),
        now=T0,
    )
    with transaction(session_factory) as s:
        record_changes(s, ev.changes, now=T0)
    (row,) = rows(session_factory)
    assert row.unit == "NVLink CRC and replay errors per 10 minutes, summed"
    assert row.labels["gpu"] == "g" * 100, "evidence keeps the full label"
    assert row.gpu is not None and row.gpu.startswith("g" * 60) and len(row.gpu) <= 64
