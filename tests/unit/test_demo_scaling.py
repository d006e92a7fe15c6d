"""The demo runs the default rule pack with hold times and range windows scaled down, nothing else."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from healer.ruleset.loading import load_ruleset
from healer_dev.demo import scale_holds
from tests.conftest import REPO


def test_scaled_pack_keeps_rules_and_shortens_holds_and_windows() -> None:
    pack = load_ruleset([REPO / "rules"], promtool=False)
    scaled = scale_holds(pack, 0.1)
    assert [r.name for r in scaled.rules] == [r.name for r in pack.rules]
    hot = scaled.rule("GpuTooHot")
    assert hot.for_ == pack.rule("GpuTooHot").for_ * 0.1
    assert hot.keep_firing_for == pack.rule("GpuTooHot").keep_firing_for * 0.1
    assert "[10m]" in pack.rule("NvlinkErrorBurst").expr
    assert "[10m]" not in scaled.rule("NvlinkErrorBurst").expr
    assert "[60s]" in scaled.rule("NvlinkErrorBurst").expr
    assert all(g.interval is not None and g.interval <= 5 for g in scaled.groups)
    # Actions are untouched.
    assert hot.actions == pack.rule("GpuTooHot").actions


def test_progress_lines_name_every_lifecycle_step_once(migrated_sqlite_url: str) -> None:
    from datetime import UTC, datetime

    from healer.model.states import NodeState
    from healer.store.nodes import get_or_create_node, transition
    from healer.store.session import make_engine, make_sessionmaker, transaction
    from healer_dev.demo import new_steps

    sessions = make_sessionmaker(make_engine(migrated_sqlite_url))
    now = datetime(2026, 12, 1, tzinfo=UTC)
    with transaction(sessions) as s:
        node = get_or_create_node(s, "gpu-node-07", now=now)
        transition(s, node, NodeState.QUARANTINED, now=now, actor="healer", reason="GpuTooHot on GPU 3")
        transition(s, node, NodeState.DRAINING, now=now, actor="healer", reason="drain started")
    with sessions() as s:
        lines, last = new_steps(s, 0)
        assert lines == [
            "gpu-node-07: healthy -> quarantined (GpuTooHot on GPU 3)",
            "gpu-node-07: quarantined -> draining (drain started)",
        ]
        assert new_steps(s, last) == ([], last)  # nothing printed twice


def test_the_summary_says_which_faulted_nodes_are_not_back(migrated_sqlite_url: str) -> None:
    from datetime import UTC, datetime

    from healer.config import load_settings
    from healer.model.states import NodeState
    from healer.store.nodes import get_or_create_node, transition
    from healer.store.session import make_engine, make_sessionmaker, transaction
    from healer_dev.demo import summarize

    sessions = make_sessionmaker(make_engine(migrated_sqlite_url))
    now = datetime(2026, 12, 1, tzinfo=UTC)
    settings = load_settings()
    assert summarize(settings, sessions, "").unfinished() == "no node was quarantined and returned to service"

    def move(name: str, *states: NodeState) -> None:
        with transaction(sessions) as s:
            node = get_or_create_node(s, name, now=now)
            for state in states:
                transition(s, node, state, now=now, actor="healer", reason=f"to {state}")

    for name in ("gpu-node-07", "gpu-node-12"):
        move(name, NodeState.QUARANTINED, NodeState.VALIDATING)
    move("gpu-node-07", NodeState.HEALTHY)
    summary = summarize(settings, sessions, "")
    assert summary.returned == 1
    assert summary.unfinished() == "1 faulted node(s) not returned to service: gpu-node-12"
    move("gpu-node-12", NodeState.HEALTHY)
    assert summarize(settings, sessions, "").unfinished() is None


def test_the_banner_gives_the_dashboard_and_the_prometheus_to_try_commands_against() -> None:
    from healer_dev.demo import banner

    lines = banner(
        nodes=64,
        time_scale=0.1,
        dashboard="http://127.0.0.1:8080",
        prometheus="http://127.0.0.1:9091",
        database="postgresql+psycopg://healer:hunter2@db.example:5432/healer",
    )
    database = next(line for line in lines if line.startswith("database: "))
    assert "HEALER_DATABASE__URL=postgresql+psycopg://" in database and "healer node list" in database
    assert "hunter2" not in database
    local = banner(
        nodes=64, time_scale=0.1, dashboard="", prometheus="", database="sqlite:////w/.demo/healer.db"
    )
    assert (
        "database: sqlite:////w/.demo/healer.db   (e.g. HEALER_DATABASE__URL=sqlite:////w/.demo/healer.db "
        in "\n".join(local)
    )
    assert "dashboard: http://127.0.0.1:8080/   (JSON API: http://127.0.0.1:8080/api/v1/nodes)" in lines
    assert lines[-1].startswith(
        "prometheus: http://127.0.0.1:9091   (e.g. HEALER_PROMETHEUS__URL=http://127.0.0.1:9091 "
    )


def test_sigterm_stops_the_demo_as_ctrl_c_does() -> None:
    """`kill` (or a CI timeout) reaches the demo's Ctrl-C path, which stops its Prometheus,
    exporters and API servers, instead of killing it with its exporters left running."""
    import os
    import signal

    from healer_dev.demo import stop_on_sigterm

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set from the main thread only")
    before = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode; never reached
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_story_waits_for_every_node_the_scenario_faults(migrated_sqlite_url: str) -> None:
    """``healer demo --duration`` ends once every faulted node (not the noise) is back in service."""
    from datetime import UTC, datetime

    from healer.config import load_settings
    from healer.model.states import NodeState
    from healer.store.nodes import get_or_create_node, transition
    from healer.store.session import make_engine, make_sessionmaker, transaction
    from healer_dev.demo import DEMO_SCENARIO, summarize
    from healer_dev.simulator.scenario import load_scenario

    faulted = load_scenario(DEMO_SCENARIO).faulted_nodes()
    assert faulted == {f"gpu-node-{n}" for n in ("07", "12", "23", "31", "40", "45")}
    sessions = make_sessionmaker(make_engine(migrated_sqlite_url))
    now = datetime(2026, 12, 1, tzinfo=UTC)
    settings = load_settings()
    back = (NodeState.QUARANTINED, NodeState.VALIDATING, NodeState.HEALTHY)
    for name in sorted(faulted)[:-1]:
        with transaction(sessions) as s:
            node = get_or_create_node(s, name, now=now)
            for state in back:
                transition(s, node, state, now=now, actor="healer", reason=f"to {state}")
    summary = summarize(settings, sessions, "", faulted=faulted)
    assert summary.unfinished() == "1 faulted node(s) not taken out and returned yet: gpu-node-45"
    with transaction(sessions) as s:
        node = get_or_create_node(s, "gpu-node-45", now=now)
        for state in back:
            transition(s, node, state, now=now, actor="healer", reason=f"to {state}")
    assert summarize(settings, sessions, "", faulted=faulted).unfinished() is None


def test_the_demo_reads_the_rule_pack_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from healer.ruleset.loading import load_ruleset
    from healer_dev.demo import demo_rules_paths

    monkeypatch.chdir(tmp_path)  # no rules/ here
    ruleset = load_ruleset(demo_rules_paths())
    assert {"GpuTooHot", "GpuFatalXid", "GPUPCIeReplayStorm"} <= {r.name for r in ruleset.rules}
