"""Scenario files: validation errors name the file, line and field; the packaged demo is valid."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from healer.cli import app
from healer_dev.simulator import FAULT_KINDS, Fleet, FleetConfig, ScenarioError, load_scenario, parse_scenario


def problems(text: str, *, fleet: FleetConfig | None = None) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        scenario = parse_scenario(text, source="s.yaml")
        Fleet(fleet or FleetConfig(nodes=8), scenario)
    return info.value.problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "faults:\n  - {at: 30s, node: gpu-node-01, gpu: 3, fault: hot_gpu, target: -5}\n",
            "s.yaml:2: faults[0].target: Input should be greater than 0 (fault hot_gpu)",
        ),
        (
            "faults:\n  - {at: soon, node: gpu-node-01, gpu: 3, fault: hot_gpu}\n",
            "s.yaml:2: faults[0].at: Value error, not a Prometheus duration: 'soon'",
        ),
        (
            "faults:\n  - {at: 1m, node: gpu-node-01, gpu: 3, fault: hot}\n",
            "s.yaml:2: faults[0].fault: Input tag 'hot'",
        ),
        (
            "faults:\n  - {at: 1m, node: gpu-node-01, gpu: 3}\n",
            "s.yaml:2: faults[0].fault: Unable to extract tag",
        ),
        (
            "faults:\n  - {at: 1m, node: gpu-node-01, gpu: 3, fault: xid}\n",
            "s.yaml:2: faults[0].code: Field required (fault xid)",
        ),
        (
            "faults:\n  - {at: 1m, node: gpu-node-01, gpu: 3, fault: xid, code: 79, duration: 5m}\n",
            "s.yaml:2: faults[0].duration: Extra inputs are not permitted (fault xid)",
        ),
        (
            "faults:\n  - {at: 1m, node: gpu-node-01, hca: ib0, fault: ib_link_flap}\n",
            "s.yaml:2: faults[0].hca: String should match pattern",
        ),
        (
            "faults:\n  - {at: 1m, node: gpu-node-01, fault: hot_gpu}\n",
            "s.yaml:2: faults[0].gpu: Field required",
        ),
        ("fault:\n  - {at: 1m}\n", "s.yaml:1: fault: Extra inputs are not permitted"),
        (
            "faults:\n  - {at: 1m, node: gpu-node-99, gpu: 1, fault: hot_gpu}\n",
            "s.yaml:2: faults[0].node: 'gpu-node-99' is not in the fleet of 8 nodes "
            "(gpu-node-00..gpu-node-07)",
        ),
        (
            "faults:\n  - {at: 1m, node: gpu-node-01, gpu: 8, fault: gpu_missing}\n",
            "s.yaml:2: faults[0].gpu: 8 but nodes have GPUs 0..7",
        ),
        (
            "faults:\n  - {at: 1m, node: gpu-node-01, hca: mlx5_9, fault: ib_symbol_errors}\n",
            "s.yaml:2: faults[0].hca: mlx5_9 but nodes have mlx5_0..mlx5_7",
        ),
        ("faults: [\n", "s.yaml:2: not valid YAML"),
        ("- just a list\n", "s.yaml: a scenario is a mapping with a 'faults' list"),
    ],
)
def test_errors_name_the_line_and_field(text: str, expected: str) -> None:
    found = problems(text)
    assert any(p.startswith(expected) for p in found), found


def test_every_problem_is_reported_at_once() -> None:
    text = """\
faults:
  - at: 30s
    node: gpu-node-01
    gpu: 3
    fault: hot_gpu
    target: 500
  - at: 1m
    node: gpu-node-02
    hca: mlx5_1
    fault: ib_link_flap
    flaps: 0
"""
    found = problems(text)
    assert found == [
        "s.yaml:6: faults[0].target: Input should be less than 150 (fault hot_gpu)",
        "s.yaml:11: faults[1].flaps: Input should be greater than or equal to 1 (fault ib_link_flap)",
    ]


def test_packaged_demo_has_every_headline_fault_on_different_nodes() -> None:
    demo = load_scenario("demo")
    kinds = {f.fault for f in demo.faults}
    assert {"hot_gpu", "xid", "nvlink_errors", "ib_link_flap", "silent_throttle"} <= kinds
    assert kinds <= set(FAULT_KINDS)
    assert 79 in {getattr(f, "code", None) for f in demo.faults}
    by_kind = {f.fault: f.node for f in demo.faults}
    headline = [by_kind[k] for k in ("hot_gpu", "nvlink_errors", "ib_link_flap", "silent_throttle")]
    assert len(set(headline)) == 4
    assert max(f.at for f in demo.faults) <= 300
    Fleet(FleetConfig(nodes=64), demo)  # fits the default fleet


def test_a_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read the scenario file"):
        load_scenario(tmp_path / "nope.yaml")


def test_cli_refuses_an_invalid_scenario_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults:\n  - {at: 10s, node: gpu-node-01, gpu: 2, fault: hot_gpu, ramp: fast}\n")
    result = CliRunner().invoke(app, ["simulate", "--nodes", "4", "--port", "0", "--scenario", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:2: faults[0].ramp: Value error, not a Prometheus duration: 'fast'" in result.output


def test_cli_refuses_the_demo_on_a_fleet_too_small_for_it() -> None:
    result = CliRunner().invoke(app, ["simulate", "--nodes", "4", "--port", "0", "--scenario", "demo"])
    assert result.exit_code == 2
    assert "faults[0].node: 'gpu-node-07' is not in the fleet of 4 nodes" in result.output
