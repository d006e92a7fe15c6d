"""Detection end to end: a real Prometheus scraping the fleet simulator, the default rules, healer's
source, evaluation and records.

One timeline (module fixture) drives a small fleet through its faults with the simulator's manual
clock; healer ticks at wall-clock time, as Prometheus stores the scrapes. The default rules run
with their PromQL unchanged and `for`/`keep_firing_for` shortened to seconds. Tests then assert on
what the ticks saw.

Series the simulator does not produce (windowed Xid counts, double-bit ECC, pending row remaps,
InfiniBand link-integrity and buffer-overrun counters) come from a second, tiny exporter in this
file, scraped by the same Prometheus.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.orm import Session, sessionmaker

from healer.detection import DetectionResult, initial_state, run_detection
from healer.engine.evaluation import ChangeKind, RuleReport
from healer.model.findings import Finding
from healer.model.states import RuleHealth
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import RuleGroup, RuleSet
from healer.sources.prometheus import PrometheusSource
from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.simulator import Fleet, FleetConfig, ManualClock, SimulatorServer, parse_scenario
from tests.healer_cli import run_healer
from tests.prometheus_releases import PrometheusRelease
from tests.services import (
    PrometheusServer,
    ScrapeTarget,
    simulator_targets,
    text_exporter,
    wait_until,
)

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
FOR = 2.0  # seconds: every rule with a `for` waits this long here
HOLD = 3.0  # seconds: every recovery hold

# Nodes of the fleet (gpu-node-00 .. gpu-node-19) and what happens to them.
HOT, SLOW, BRAKE, XID79, XID45, REMAP = (
    "gpu-node-01",
    "gpu-node-02",
    "gpu-node-03",
    "gpu-node-04",
    "gpu-node-05",
    "gpu-node-06",
)
NVBURST, NVRECOVERY, IBFLAP, IBSYMBOL, THROTTLE = (
    "gpu-node-07",
    "gpu-node-08",
    "gpu-node-09",
    "gpu-node-10",
    "gpu-node-11",
)
RESTART, DOWN, EXTRA, MISSING = "gpu-node-12", "gpu-node-13", "gpu-node-15", "gpu-node-16"
IDLE = ("gpu-node-14", "gpu-node-18")  # idle with seed 0: only the idle clock bit set
FAULT_AT, RECOVER_AT, MISSING_AT = 60, 300, 400  # simulated seconds
FAULTS: list[dict[str, object]] = [
    {"at": FAULT_AT, "node": HOT, "gpu": 3, "fault": "hot_gpu", "target": 86, "duration": RECOVER_AT - 70},
    {"at": FAULT_AT, "node": SLOW, "gpu": 1, "fault": "thermal_slowdown", "reasons": 0x48},
    {"at": FAULT_AT, "node": BRAKE, "gpu": 2, "fault": "thermal_slowdown", "reasons": 0x80},
    {"at": FAULT_AT, "node": XID79, "gpu": 5, "fault": "xid", "code": 79},
    {"at": FAULT_AT, "node": XID45, "gpu": 0, "fault": "xid", "code": 45},
    {"at": FAULT_AT, "node": REMAP, "gpu": 4, "fault": "row_remap_failure"},
    {"at": FAULT_AT, "node": NVBURST, "gpu": 2, "fault": "nvlink_errors", "crc_flit": 2400, "duration": 30},
    {
        "at": FAULT_AT,
        "node": NVRECOVERY,
        "gpu": 6,
        "fault": "nvlink_errors",
        **{"crc_flit": 0, "crc_data": 0, "replay": 0, "recovery": 4},
    },
    {"at": FAULT_AT, "node": IBFLAP, "hca": "mlx5_1", "fault": "ib_link_flap", "flaps": 2, "interval": 10},
    {
        "at": FAULT_AT,
        "node": IBSYMBOL,
        "hca": "mlx5_0",
        "fault": "ib_symbol_errors",
        **{"count": 6000, "port_rcv_errors": 6000, "link_error_recovery": 900, "duration": 30},
    },
    {"at": FAULT_AT, "node": THROTTLE, "gpu": 6, "fault": "silent_throttle", "tensor_active": 0.1},
    {"at": FAULT_AT, "node": RESTART, "fault": "exporter_restart"},  # counters back to 0
    {"at": FAULT_AT, "node": DOWN, "gpu": 0, "fault": "hot_gpu", "target": 86},
    {"at": RECOVER_AT - 20, "node": DOWN, "fault": "exporter_down"},
    {"at": MISSING_AT, "node": MISSING, "gpu": 7, "fault": "gpu_missing"},
]
SCENARIO = yaml.safe_dump({"name": "detection-test", "faults": FAULTS})

# rule → the (node, gpu-or-HCA) where it must fire, and nowhere else.
EXPECTED: dict[str, set[tuple[str, str | None]]] = {
    "GpuTooHot": {(HOT, "3"), (DOWN, "0")},
    "GpuThermalMarginLow": {(HOT, "3"), (DOWN, "0")},
    "GpuHardwareSlowdown": {(SLOW, "1")},
    "GpuPowerBrake": {(BRAKE, "2")},
    "GpuFatalXid": {(XID79, "5")},
    "GpuFatalXidRecent": {(XID79, "5"), (EXTRA, "1")},
    "GpuRowRemapFailure": {(REMAP, "4")},
    "GpuRowRemapPending": {(EXTRA, "2")},
    "GpuDoubleBitEccErrors": {(EXTRA, "3")},
    "GpuMissing": {(MISSING, None)},
    "GpuSilentThrottling": {(THROTTLE, "6")},
    "NvlinkErrorBurst": {(NVBURST, "2")},
    "NvlinkRecoveryErrors": {(NVRECOVERY, "6")},
    "InfinibandLinkDowned": {(IBFLAP, "mlx5_1")},
    "InfinibandLinkIntegrityErrors": {(EXTRA, "mlx5_7")},
    "InfinibandBufferOverrun": {(EXTRA, "mlx5_7")},
    "InfinibandSymbolErrorsFatal": {(IBSYMBOL, "mlx5_0")},
    "InfinibandSymbolErrorRate": {(IBSYMBOL, "mlx5_0")},
    "InfinibandLinkErrorRecovery": {(IBSYMBOL, "mlx5_0")},
    "InfinibandPortReceiveErrors": {(IBSYMBOL, "mlx5_0")},
    # 900 link error recoveries: past what the 8-bit sysfs counter holds (255), where a real HCA's
    # counter stays pinned: a finding of its own.
    "InfinibandCounterSaturated": {(IBSYMBOL, "mlx5_0")},
    # The rules below see nothing wrong in this scenario (its Xids are 79 and 45, both in the catalog;
    # the flapping port is DOWN for less than the hold).
    "GpuNvlink5XidCorroborated": set(),
    "Nvlink5LinkErrors": set(),  # a Hopper fleet: no NVLink5 counters
    "GpuUnknownXid": set(),
    "GpuRecoveryActionRequired": set(),
    "InfinibandPortNotActive": set(),
    "InfinibandPortMissing": set(),
    # The node agent's hw_counters: the simulated fleet runs no agent (tests/integration/
    # test_agent_metrics_prometheus.py fires it from the agent's /metrics).
    "InfinibandTransportRetries": set(),
}
NO_DATA_EXPECTED = {
    "DcgmExporterSilent": {DOWN},
    "InfinibandExporterSilent": {DOWN},
    "ExporterTargetDown": {DOWN},
}


def where(f: Finding) -> tuple[str, str | None]:
    return (f.node, f.gpu if f.gpu is not None else f.labels.get("device"))


# --- the extra exporter: series the simulator does not have ---------------------------------


def extra_exposition(fleet: Fleet, faulty: bool) -> str:
    def gpu(g: int) -> str:
        return (
            f'gpu="{g}",UUID="{fleet.gpu_uuid(EXTRA, g)}",device="nvidia{g}",'
            f'modelName="NVIDIA H100 80GB HBM3",Hostname="{EXTRA}"'
        )

    on = 1 if faulty else 0
    lines = [
        "# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge",
        f'DCGM_EXP_XID_ERRORS_COUNT{{{gpu(1)},xid="79",window_size_in_ms="300000"}} {on}',
        # Xid 45 alone, however often, is application noise.
        f'DCGM_EXP_XID_ERRORS_COUNT{{{gpu(0)},xid="45",window_size_in_ms="300000"}} {5 * on}',
        "# TYPE DCGM_FI_DEV_ROW_REMAP_PENDING gauge",
        *(f"DCGM_FI_DEV_ROW_REMAP_PENDING{{{gpu(g)}}} {on if g == 2 else 0}" for g in range(4)),
        "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter",
        *(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{gpu(g)}}} {2 * on if g == 3 else 0}" for g in range(4)),
        "# TYPE node_infiniband_local_link_integrity_errors_total counter",
        f'node_infiniband_local_link_integrity_errors_total{{device="mlx5_7",port="1"}} {3 * on}',
        "# TYPE node_infiniband_excessive_buffer_overrun_errors_total counter",
        f'node_infiniband_excessive_buffer_overrun_errors_total{{device="mlx5_7",port="1"}} {on}',
    ]
    return "\n".join(lines) + "\n"


def extra_exporter(fleet: Fleet, clock: ManualClock) -> contextlib.AbstractContextManager[str]:
    """Serve :func:`extra_exposition` (faulty from FAULT_AT on the simulated clock); yields host:port."""
    return text_exporter(lambda: extra_exposition(fleet, clock() >= FAULT_AT))


@contextlib.contextmanager
def hanging_server() -> Iterator[str]:
    """A TCP port that accepts connections (the kernel's backlog) and never answers: a hung
    Prometheus. Yields its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def shortened_ruleset(paths: list[Path]) -> RuleSet:
    """The rule pack with `for` cut to FOR and `keep_firing_for` to HOLD (PromQL unchanged)."""
    pack = load_ruleset(paths)
    groups = []
    for group in pack.groups:
        rules = [
            r.model_copy(update={"for_": min(r.for_, FOR), "keep_firing_for": min(r.keep_firing_for, HOLD)})
            for r in group.rules
        ]
        groups.append(RuleGroup(name=group.name, interval=1, rules=rules))
    return RuleSet(groups=tuple(groups), sources=pack.sources)


# --- the timeline ------------------------------------------------------------------------------


@dataclass
class Timeline:
    fleet: Fleet
    prometheus: PrometheusServer
    ruleset: RuleSet
    db_url: str
    baseline: DetectionResult | None = None
    faults: list[DetectionResult] = field(default_factory=list)  # FAULT_AT .. RECOVER_AT
    recovery: list[DetectionResult] = field(default_factory=list)  # RECOVER_AT .. MISSING_AT
    missing: list[DetectionResult] = field(default_factory=list)  # from MISSING_AT
    queries_per_tick: set[int] = field(default_factory=set)

    @property
    def all_ticks(self) -> list[DetectionResult]:
        return [t for t in (self.baseline, *self.faults, *self.recovery, *self.missing) if t is not None]


def seen(ticks: list[DetectionResult], rule: str) -> set[tuple[str, str | None]]:
    """Where ``rule`` was pending or firing in any of ``ticks``."""
    return {
        where(f)
        for t in ticks
        for fs in (*t.findings.firing.values(), *t.findings.pending.values())
        for f in fs
        if f.rule == rule
    }


def firing(result: DetectionResult, rule: str) -> set[tuple[str, str | None]]:
    return {where(f) for fs in result.findings.firing.values() for f in fs if f.rule == rule}


@pytest.fixture(scope="module")
def timeline(
    tmp_path_factory: pytest.TempPathFactory, prometheus_release: PrometheusRelease
) -> Iterator[Timeline]:
    clock = ManualClock(0)
    fleet = Fleet(FleetConfig(nodes=20, hcas=2, seed=0, idle_fraction=0.2), parse_scenario(SCENARIO))
    assert [n for n in fleet.node_names if fleet.is_idle(n)] == list(IDLE)
    db_url = f"sqlite:///{tmp_path_factory.mktemp('detection') / 'healer.db'}"
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    factory: sessionmaker[Session] = make_sessionmaker(engine)
    with SimulatorServer(fleet, clock=clock) as sim, extra_exporter(fleet, clock) as extra:
        targets = simulator_targets(fleet.targets(sim.address), sim.address)
        targets.append(ScrapeTarget(address=extra, job="healer-test-extra", labels={"node": EXTRA}))
        with prometheus_release.server(targets, scrape_interval="1s") as prom:
            ruleset = shortened_ruleset([REPO / "rules"])
            line = Timeline(fleet=fleet, prometheus=prom, ruleset=ruleset, db_url=db_url)
            state = initial_state(factory)

            def tick() -> DetectionResult:
                nonlocal state
                with PrometheusSource(prom.url, timeout_seconds=10, tick_deadline_seconds=20) as source:
                    result = run_detection(
                        ruleset=ruleset,
                        source=source,
                        session_factory=factory,
                        state=state,
                        now=datetime.now(UTC),
                    )
                    assert source.queries_sent == result.queries
                state = result.state
                line.queries_per_tick.add(result.queries)
                return result

            def tick_until(
                into: list[DetectionResult],
                missing: Callable[[list[DetectionResult]], object],
                timeout: float,
            ) -> None:
                """Tick until ``missing(ticks)`` is falsy; else fail with what it still reports."""
                deadline = time.monotonic() + timeout
                while True:
                    into.append(tick())
                    left = missing(into)
                    if not left:
                        return
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"after {timeout}s still missing: {left}")
                    time.sleep(0.25)

            # Every target scraped twice, so counters have a baseline before anything happens.
            prom.wait_for_targets_up(len(targets))
            wait_until(
                lambda: len(prom.query("count_over_time(up[1m]) >= 2")) == len(targets),
                timeout=20,
                what="two scrapes of every target",
            )
            line.baseline = tick()

            # Faults on.
            clock.set(FAULT_AT + 30)
            phase1 = {r: w for r, w in EXPECTED.items() if r != "GpuMissing"}

            def not_fired(ticks: list[DetectionResult]) -> dict[str, object]:
                fired = {r: set().union(*(firing(t, r) for t in ticks)) for r in phase1}
                return {r: w - fired[r] for r, w in phase1.items() if w - fired[r]}

            tick_until(line.faults, not_fired, timeout=40)
            # A few more ticks so that "nowhere else" is checked over time, not at one instant.
            for _ in range(3):
                line.faults.append(tick())

            # HOT's GPU cools down; DOWN's exporter dies while its GPU is (last seen) hot.
            clock.set(RECOVER_AT)

            def hot_not_resolved_or_down_not_held(ticks: list[DetectionResult]) -> str:
                resolved = any(
                    c.kind == ChangeKind.RESOLVED and c.finding.rule == "GpuTooHot" and c.finding.node == HOT
                    for t in ticks
                    for c in t.changes
                )
                unknown_for = [t.findings.at for t in ticks if DOWN in t.findings.unknown]
                if not resolved:
                    return f"GpuTooHot on {HOT} resolved"
                if not unknown_for or (unknown_for[-1] - unknown_for[0]).total_seconds() <= HOLD + 1:
                    return f"{DOWN} unknown for {HOLD + 1}s"
                return ""

            tick_until(line.recovery, hot_not_resolved_or_down_not_held, timeout=40)

            # GpuMissing compares with the node's GPU count at minute steps over the last hour:
            # wait for a minute step with MISSING's 8 GPUs on record, then pull GPU 7.
            wait_until(
                lambda: prom.query(
                    "max_over_time((count by (Hostname) "
                    f'(DCGM_FI_DEV_GPU_TEMP{{Hostname="{MISSING}"}}))[1h:1m]) == 8'
                ),
                timeout=75,
                interval=0.5,
                what="a minute step of the subquery with 8 GPUs",
            )
            clock.set(MISSING_AT)
            tick_until(
                line.missing, lambda ticks: not firing(ticks[-1], "GpuMissing") and "GpuMissing", timeout=30
            )
            yield line
    engine.dispose()


# --- what the ticks saw ------------------------------------------------------------------------


def test_every_default_rule_is_covered(timeline: Timeline) -> None:
    assert {r.name for r in timeline.ruleset.rules} == set(EXPECTED) | set(NO_DATA_EXPECTED)


def test_healthy_fleet_fires_nothing(timeline: Timeline) -> None:
    base = timeline.baseline
    assert base is not None
    assert base.findings.firing == {} and base.findings.pending == {}
    assert base.findings.unknown == frozenset()
    assert {r.health for r in base.reports} == {RuleHealth.OK}


@pytest.mark.parametrize("rule", sorted(EXPECTED))
def test_rule_fires_on_its_fault_and_nowhere_else(timeline: Timeline, rule: str) -> None:
    assert seen(timeline.all_ticks, rule) == EXPECTED[rule]
    fired = set().union(*(firing(t, rule) for t in timeline.all_ticks))
    assert fired == EXPECTED[rule]


def test_findings_fire_only_after_their_for(timeline: Timeline) -> None:
    pending_keys = {
        c.finding.series_key for t in timeline.all_ticks for c in t.changes if c.kind == ChangeKind.PENDING
    }
    fired = [c.finding for t in timeline.all_ticks for c in t.changes if c.kind == ChangeKind.FIRED]
    assert {f.rule for f in fired} == {rule for rule, where in EXPECTED.items() if where}
    for f in fired:
        assert f.active_since is not None and f.fired_at is not None
        if timeline.ruleset.rule(f.rule).for_ > 0:
            assert f.series_key in pending_keys, f"{f.rule} fired without being pending first"
            assert (f.fired_at - f.active_since).total_seconds() >= FOR, f.rule
        else:
            assert f.fired_at == f.active_since, f.rule


def test_findings_carry_evidence(timeline: Timeline) -> None:
    last = timeline.faults[-1]
    (hot,) = [f for f in last.findings.firing[HOT] if f.rule == "GpuTooHot"]
    assert hot.gpu == "3"
    assert hot.unit == "degrees C"
    assert hot.value is not None and 84 <= hot.value <= 88
    assert hot.labels["UUID"] == timeline.fleet.gpu_uuid(HOT, 3)
    assert hot.summary.startswith("GPU 3 at 8")
    (xid,) = [f for f in last.findings.firing[XID79] if f.rule == "GpuFatalXid"]
    assert (xid.value, xid.labels["err_code"]) == (79, "79")


def test_recovery_needs_the_recovery_hold(timeline: Timeline) -> None:
    (resolved,) = [
        c.finding
        for t in timeline.recovery
        for c in t.changes
        if c.kind == ChangeKind.RESOLVED and c.finding.rule == "GpuTooHot" and c.finding.node == HOT
    ]
    assert resolved.clear_since is not None and resolved.resolved_at is not None
    assert (resolved.resolved_at - resolved.clear_since).total_seconds() >= HOLD
    held = [t for t in timeline.recovery if resolved.clear_since <= t.findings.at < resolved.resolved_at]
    assert held, "no tick saw the finding clear but held"
    assert all((HOT, "3") in firing(t, "GpuTooHot") for t in held)


def test_exporter_down_is_unknown_not_a_finding_nor_a_recovery(timeline: Timeline) -> None:
    down_ticks = [t for t in timeline.recovery if DOWN in t.findings.unknown]
    assert (down_ticks[-1].findings.at - down_ticks[0].findings.at).total_seconds() > HOLD + 1
    for t in down_ticks:
        # Still firing from before the exporter died, however long it stays silent.
        assert (DOWN, "0") in firing(t, "GpuTooHot")
        assert t.findings.unknown <= {DOWN}
    closed = [
        c
        for t in timeline.recovery + timeline.missing
        for c in t.changes
        if c.finding.node == DOWN and c.kind in (ChangeKind.RESOLVED, ChangeKind.DROPPED)
    ]
    assert closed == []
    last = down_ticks[-1]
    reports = {r.rule: r for r in last.reports}
    for rule, nodes in NO_DATA_EXPECTED.items():
        assert reports[rule].health == RuleHealth.NO_DATA
        assert {f.node for f in last.state.series.values() if f.rule == rule} == nodes
        assert all(f.rule != rule for fs in last.findings.firing.values() for f in fs)
    # The dcgm-exporter target of DOWN has no node label (Hostname style): reported, not dropped.
    unresolved = reports["ExporterTargetDown"].unresolved
    assert unresolved is not None and unresolved.count == 1
    assert unresolved.example["job"] == "dcgm-exporter"


def test_xid45_idle_clocks_and_counter_reset_fire_nothing(timeline: Timeline) -> None:
    quiet = {XID45, RESTART, *IDLE}
    for t in timeline.all_ticks:
        assert quiet.isdisjoint(t.findings.firing) and quiet.isdisjoint(t.findings.pending)
        assert quiet.isdisjoint(t.findings.unknown)


def test_one_query_per_rule_per_tick(timeline: Timeline) -> None:
    assert timeline.queries_per_tick == {len(timeline.ruleset.rules)}
    unhealthy = [
        (r.rule, r.health, r.error)
        for t in timeline.all_ticks
        for r in t.reports
        if r.health not in (RuleHealth.OK, RuleHealth.NO_DATA) and not _dead_unlabelled_target(r)
    ]
    assert not unhealthy, unhealthy


def _dead_unlabelled_target(report: RuleReport) -> bool:
    """DOWN's dcgm-exporter target carries no node label on purpose; its `up == 0` series names no
    node. The two targets of DOWN are scraped at different offsets, so for a tick or two that series
    can be the rule's only one: the rule is then DEGRADED (not NO_DATA), which is the truth."""
    return (
        report.rule == "ExporterTargetDown"
        and report.health == RuleHealth.DEGRADED
        and report.unresolved is not None
        and report.unresolved.count == 1
        and report.unresolved.example.get("job") == "dcgm-exporter"
    )


def _dead_unlabelled_target_json(rule: dict[str, Any]) -> bool:
    """:func:`_dead_unlabelled_target` of a rule as ``evaluate --format json`` prints it."""
    unresolved = rule.get("unresolved") or {}
    return (
        rule["rule"] == "ExporterTargetDown"
        and rule["health"] == "degraded"
        and unresolved.get("count") == 1
        and (unresolved.get("example") or {}).get("job") == "dcgm-exporter"
    )


def test_ticks_are_recorded(timeline: Timeline) -> None:
    from sqlalchemy import func, select

    from healer.store.models import Finding as FindingRow
    from healer.store.models import Gpu, RuleEvaluation

    engine = make_engine(timeline.db_url)
    with make_sessionmaker(engine)() as s:
        evaluations = s.scalar(select(func.count()).select_from(RuleEvaluation))
        assert evaluations == len(timeline.all_ticks) * len(timeline.ruleset.rules)
        hot_rows = s.scalars(
            select(FindingRow).where(FindingRow.rule == "GpuTooHot", FindingRow.node_name == HOT)
        ).all()
        assert [(r.state, r.gpu) for r in hot_rows] == [("resolved", "3")]
        uuids = set(s.scalars(select(Gpu.uuid)))
        assert timeline.fleet.gpu_uuid(HOT, 3) in uuids
        open_rows = s.scalars(select(FindingRow).where(FindingRow.state.in_(["pending", "firing"]))).all()
        assert {r.series_key for r in open_rows} == {
            f.series_key
            for f in timeline.all_ticks[-1].state.series.values()
            if f.rule not in NO_DATA_EXPECTED
        }
    engine.dispose()


# --- a hung Prometheus -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("concurrency", "sent"),
    [
        (1, (2, 3)),  # 0.4 s each until the 1 s deadline; the rest never sent
        (4, (4, 12)),  # at most 4 at a time, 0.4 s each, until the 1 s deadline
    ],
)
def test_hung_prometheus_ends_the_tick_at_its_deadline(
    timeline: Timeline, concurrency: int, sent: tuple[int, int]
) -> None:
    before = timeline.all_ticks[-1]
    with (
        hanging_server() as url,
        PrometheusSource(url, timeout_seconds=0.4, tick_deadline_seconds=1.0) as source,
    ):
        started = time.monotonic()
        result = run_detection(
            ruleset=timeline.ruleset,
            source=source,
            session_factory=None,
            state=before.state,
            now=datetime.now(UTC),
            concurrency=concurrency,
        )
        elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 1.8  # the deadline holds, with one query or several in flight
    assert sent[0] <= result.queries <= sent[1]
    assert source.queries_sent == result.queries
    assert {r.health for r in result.reports} == {RuleHealth.UNAVAILABLE}
    errors = [r.error or "" for r in result.reports]
    assert sum("timed out" in e for e in errors) == result.queries
    assert sum("not queried" in e for e in errors) == len(errors) - result.queries
    assert result.findings.frozen_rules == {r.name for r in timeline.ruleset.rules}
    assert result.source_unavailable
    # Nothing resolved, nothing new: the previous findings stand.
    assert result.changes == []
    assert result.findings.firing == before.findings.firing
    assert result.findings.unknown == before.findings.unknown


# --- concurrent queries give the sequential tick's answer ---------------------------------------


def _comparable(result: DetectionResult) -> tuple[object, ...]:
    """Everything a tick decides, without the wall-clock query times."""
    reports = [(r.rule, r.health, r.error, r.series, r.pending, r.firing, r.warnings) for r in result.reports]
    return (reports, result.changes, result.state, result.findings, result.queries)


@pytest.mark.parametrize("phase", ["faults", "recovery", "missing"])
def test_concurrent_tick_equals_the_sequential_tick(timeline: Timeline, phase: str) -> None:
    """The same previous state and the same ``time=``: 1 query at a time and 4 at a time agree on
    every report, change, finding and the next state, over each phase of the timeline."""
    ticks: list[DetectionResult] = getattr(timeline, phase)
    assert len(ticks) >= 2
    previous, tick = ticks[-2], ticks[-1]
    answers = {}
    for concurrency in (1, 4):
        with PrometheusSource(timeline.prometheus.url, timeout_seconds=5, tick_deadline_seconds=15) as source:
            answers[concurrency] = run_detection(
                ruleset=timeline.ruleset,
                source=source,
                session_factory=None,
                state=previous.state,
                now=tick.findings.at,
                concurrency=concurrency,
            )
    assert answers[4].queries == len(timeline.ruleset.rules)
    assert _comparable(answers[4]) == _comparable(answers[1])
    assert answers[4].findings.firing  # the comparison is over real findings, not two empty ticks


# --- healer evaluate --once --------------------------------------------------------------------


def run_cli(*args: str, prometheus_url: str, db_url: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HEALER_PROMETHEUS__URL": prometheus_url,
        "HEALER_PROMETHEUS__TIMEOUT_SECONDS": "2",
        "HEALER_RULES_PATHS": json.dumps([str(REPO / "rules")]),
        "HEALER_DATABASE__URL": db_url,
    }
    return run_healer(*args, env=env)


def test_cli_evaluate_once(timeline: Timeline, migrated_sqlite_url: str) -> None:
    db_url = migrated_sqlite_url
    url = timeline.prometheus.url
    done = run_cli("evaluate", "--once", "--format", "json", prometheus_url=url, db_url=db_url)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    by_rule = {(f["rule"], f["node"], f["gpu"]): f for f in out["findings"]}
    xid = by_rule[("GpuFatalXid", XID79, "5")]  # `for: 0s` in the default pack: firing at once
    assert (xid["state"], xid["value"], xid["unit"]) == ("firing", 79, "Xid code")
    slow = by_rule[("GpuHardwareSlowdown", SLOW, "1")]  # `for: 5m`: pending on a first look
    assert slow["state"] == "pending"
    assert DOWN in out["unknown"]
    assert out["queries"] == len(timeline.ruleset.rules)
    unhealthy = [
        (r["rule"], r["health"], r["error"])
        for r in out["rules"]
        if r["health"] not in ("ok", "no_data") and not _dead_unlabelled_target_json(r)
    ]
    assert not unhealthy, unhealthy

    table = run_cli("evaluate", "--once", prometheus_url=url, db_url=db_url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert any(line.split()[:5] == [XID79, "5", "GpuFatalXid", "firing", "79"] for line in lines if line)
    header = next(line for line in lines if line.startswith("NODE"))
    assert header.split() == ["NODE", "GPU", "RULE", "STATE", "VALUE", "SINCE"]
    assert any(line.startswith("no data (unknown") and DOWN in line for line in lines)
    # Resumed from the store: the pending finding's SINCE is the first run's time, not "0s ago".
    slow_row = next(
        line for line in lines if line.split()[:4] == [SLOW, "1", "GpuHardwareSlowdown", "pending"]
    )
    assert slow_row.endswith(" ago)") and "(0s ago)" not in slow_row

    once = run_cli("evaluate", "--once", "--no-store", prometheus_url=url, db_url="sqlite://")
    assert once.returncode == 0, once.stderr
    lines = once.stdout.splitlines()
    # One-shot, nothing recorded before: when a condition began is not known, and the table says so.
    slow_row = next(
        line for line in lines if line.split()[:4] == [SLOW, "1", "GpuHardwareSlowdown", "pending"]
    )
    assert slow_row.split()[-1] == "-"
    assert "(0s ago)" not in once.stdout
    assert "SINCE -: first seen at this tick" in once.stdout


def test_cli_exit_status_when_prometheus_is_unavailable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run_cli(
        "evaluate", "--once", "--no-store", prometheus_url=f"http://127.0.0.1:{port}", db_url="sqlite://"
    )
    assert done.returncode == 1
    assert "unavailable" in done.stdout and "Connection refused" in done.stdout
    # The source's error once, above the rule table; each rule's row says only "unavailable".
    assert done.stdout.count("Connection refused") == 1
    assert "\nmetrics source unavailable: " in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if " unavailable " in f" {line} "]
    assert any(row[-1] == "unavailable" and row[2] == "unavailable" for row in rows)
    assert "no findings known: the metrics source could not be queried" in done.stdout
    assert "\nno findings\n" not in done.stdout
