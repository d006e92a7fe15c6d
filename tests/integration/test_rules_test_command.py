"""``healer rules test`` as a user runs it: the shipped tests of the default pack pass on a real
Prometheus (promtool-built blocks), and a wrong expectation fails with file:line, the test's name
and expected against got."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from healer.cli import app
from healer.ruleset.loading import load_ruleset
from tests.conftest import REPO

pytestmark = pytest.mark.prometheus


@pytest.fixture(autouse=True)
def _tools(monkeypatch: pytest.MonkeyPatch) -> None:
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.skip("prometheus/promtool not installed")
    for key in list(os.environ):
        if key.startswith("HEALER_"):
            monkeypatch.delenv(key)


def test_the_default_pack_passes_its_shipped_tests() -> None:
    result = CliRunner().invoke(app, ["rules", "test", str(REPO / "rules" / "tests")])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("OK: ")


def test_every_rule_of_the_default_pack_has_a_test() -> None:
    yaml = YAML(typ="safe")
    tested: set[str] = set()
    firing: set[str] = set()
    for path in (REPO / "rules" / "tests").glob("*.yaml"):
        doc = yaml.load(path.read_text())
        for test in doc["tests"]:
            for exp in test.get("exp_findings", []):
                tested.add(exp["rule"])
                if exp.get("findings"):
                    firing.add(exp["rule"])
    ruleset = load_ruleset([REPO / "rules"], promtool=False)
    assert {r.name for r in ruleset.rules} <= tested
    # Fault rules are shown firing; no_data rules never make findings (their nodes become unknown).
    assert {r.name for r in ruleset.rules if r.kind == "fault"} <= firing


def _broken_copy(tmp_path: Path) -> Path:
    """rules/tests/gpu-thermal.yaml with its rule file next to it and two wrong expectations."""
    shutil.copy(REPO / "rules" / "gpu-thermal.yaml", tmp_path / "gpu-thermal.yaml")
    text = (REPO / "rules" / "tests" / "gpu-thermal.yaml").read_text()
    text = text.replace("rule_files: [../gpu-thermal.yaml]", "rule_files: [gpu-thermal.yaml]")
    text = text.replace(
        '- {node: gpu-node-1, labels: {gpu: "0", UUID: GPU-a}}', '- {node: gpu-node-1, labels: {gpu: "1"}}'
    )
    text = text.replace(
        "- {node: gpu-node-1, step: quarantine, at: 7m}", "- {node: gpu-node-1, step: quarantine, at: 6m}"
    )
    path = tmp_path / "thermal-test.yaml"
    path.write_text(text)
    return path


def test_a_wrong_expectation_fails_with_a_clear_diff(tmp_path: Path) -> None:
    path = _broken_copy(tmp_path)
    lines = path.read_text().splitlines()
    finding_line = next(i for i, line in enumerate(lines, 1) if 'labels: {gpu: "1"}' in line) - 3
    step_line = next(i for i, line in enumerate(lines, 1) if "step: quarantine, at: 6m" in line)

    result = CliRunner().invoke(app, ["rules", "test", str(path)])

    assert result.exit_code == 1
    err = result.stderr
    name = "a GPU above 78 C for 5 minutes is quarantined, drained and ticketed"
    assert f"FAILED {path}:{finding_line}: test {name!r}: firing findings of GpuTooHot at 8m" in err
    assert '    - gpu-node-1 {gpu="1"}' in err
    assert '    + gpu-node-1 {gpu="0"}' in err
    assert f"FAILED {path}:{step_line}: test {name!r}: steps by 8m" in err
    assert "    - gpu-node-1 quarantine by 6m" in err
    assert "    + gpu-node-1 quarantine at 7m" in err
    assert "      gpu-node-1 drain by 7m30s (at 7m)" in err
    assert "FAIL: 3 of 4 test(s) passed in 1 file(s)" in err


def test_a_malformed_test_file_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "rule_files: [x.yaml]\ntests:\n  - name: t\n    input_series:\n"
        "      - series: 'm{a=\"1\"}'\n        values: '1 2 oops'\n"
    )
    (tmp_path / "x.yaml").write_text((REPO / "rules" / "nvlink.yaml").read_text())
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 1
    assert f"error: {path}:3: not a value in promtool's notation: 'oops'" in result.stderr
