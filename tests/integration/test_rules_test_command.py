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
from tests.service_skips import require_binary

pytestmark = pytest.mark.prometheus


@pytest.fixture(autouse=True)
def _tools(monkeypatch: pytest.MonkeyPatch) -> None:
    require_binary("prometheus", package="prometheus")
    require_binary("promtool", package="prometheus")
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


_SMALL_RULES = """\
groups:
  - name: g
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 80
        for: 1m
        severity: critical
        annotations: {summary: hot}
"""

_SMALL_TEST = """\
rule_files: [rules.yaml]
tests:
  - name: hot GPU
    input_series:
      - series: 'DCGM_FI_DEV_GPU_TEMP{Hostname="n1", gpu="0"}'
        values: '90x5'
    exp_findings:
      - eval_time: 3m
        rule: GpuTooHot
        findings:
          - {node: n1, labels: {gpu: "0"}}
"""


def _small(tmp_path: Path, rules: str = _SMALL_RULES, test: str = _SMALL_TEST) -> Path:
    (tmp_path / "rules.yaml").write_text(rules)
    path = tmp_path / "my-test.yaml"
    path.write_text(test)
    return path


def test_bad_promql_fails_up_front_at_the_rule_files_line_and_column(tmp_path: Path) -> None:
    path = _small(tmp_path, rules=_SMALL_RULES.replace("> 80", "> > 80"))
    validate = CliRunner().invoke(app, ["rules", "validate", str(tmp_path / "rules.yaml")])
    problem = validate.stderr.strip()
    assert problem.startswith(f"{tmp_path / 'rules.yaml'}:5:"), problem

    result = CliRunner().invoke(app, ["rules", "test", str(path)])

    assert result.exit_code == 1
    assert f"error: {problem}" in result.stderr
    assert "FAILED" not in result.stderr  # no run, so no cascade of failures
    assert "FAIL: 0 of 0 test(s) passed in 1 file(s); 1 file(s) not run (errors above)" in result.stderr
    assert "HTTP 400" not in result.stderr


def test_a_misspelt_rule_name_is_an_unknown_rule_with_a_suggestion(tmp_path: Path) -> None:
    path = _small(tmp_path, test=_SMALL_TEST.replace("rule: GpuTooHot", "rule: GpuTooHto"))
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 1
    assert (
        f"error: {path}:9: exp_findings: unknown rule 'GpuTooHto' (did you mean 'GpuTooHot'?)"
        in result.stderr
    )


def test_a_bad_step_name_names_the_file_once_and_the_steps_line(tmp_path: Path) -> None:
    path = _small(
        tmp_path, test=_SMALL_TEST + "    exp_steps:\n      - {node: n1, step: quarantin, at: 3m}\n"
    )
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 1
    assert f"error: {path}:13: exp_steps: step 'quarantin' is not one of quarantine, drain, ticket" in (
        result.stderr
    )
    assert result.stderr.count(str(path)) == 1


def test_a_missing_path_and_broken_yaml_read_cleanly(tmp_path: Path) -> None:
    missing = tmp_path / "nosuch-dir"
    result = CliRunner().invoke(app, ["rules", "test", f"{missing}/"])
    assert result.exit_code == 1
    assert f"error: {missing}: cannot read: No such file or directory" in result.stderr
    assert ":0:" not in result.stderr

    broken = _small(tmp_path, test=_SMALL_TEST.replace("  - name: hot GPU", "  - name: [hot GPU"))
    result = CliRunner().invoke(app, ["rules", "test", str(broken)])
    assert result.exit_code == 1
    assert f"error: {broken}:" in result.stderr
    assert "YAML syntax error" in result.stderr
    assert "<unicode string>" not in result.stderr
    assert ":0:" not in result.stderr


_PROMETHEUS_RULES = """\
groups:
  - name: g
    rules:
      - alert: GpuTooHot
        expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 80
        for: 1m
        annotations: {summary: "GPU {{ $labels.gpu }} at {{ $value }} C"}
"""

_ALERT_TEST = """\
rule_files: [rules.yaml]
tests:
  - name: hot GPU
    interval: 1m
    input_series:
      - series: 'DCGM_FI_DEV_GPU_TEMP{Hostname="n1", gpu="0"}'
        values: '90x5'
    alert_rule_test:
      - eval_time: 3m
        alertname: GpuTooHot
        exp_alerts:
          - exp_labels: {Hostname: n1, gpu: "0"}
            exp_annotations: {summary: "GPU 0 at 90 C"}
  - name: cool GPU
    interval: 1m
    input_series:
      - series: 'DCGM_FI_DEV_GPU_TEMP{Hostname="n1", gpu="0"}'
        values: '60x5'
    alert_rule_test:
      - eval_time: 3m
        alertname: GpuTooHot
        exp_alerts: []
"""


def test_a_promtool_test_file_runs_as_promtool_runs_it(tmp_path: Path) -> None:
    path = _small(tmp_path, rules=_PROMETHEUS_RULES, test=_ALERT_TEST)
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 0, result.stderr
    assert "OK: 2 of 2 test(s) passed in 1 file(s)" in result.stdout


def test_a_failing_promtool_test_is_named_at_its_line_with_promtools_expected_and_got(tmp_path: Path) -> None:
    path = _small(tmp_path, rules=_PROMETHEUS_RULES, test=_ALERT_TEST.replace("at 90 C", "at 91 C"))
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 1
    err = result.stderr
    assert f"FAILED {path}:3: test 'hot GPU': promtool test rules:" in err
    assert 'Annotations:{summary="GPU 0 at 91 C"}' in err  # expected
    assert 'Annotations:{summary="GPU 0 at 90 C"}' in err  # got: the template expanded by Prometheus
    assert "cool GPU" not in err
    assert "FAIL: 1 of 2 test(s) passed in 1 file(s)" in err


def test_stale_is_a_staleness_marker_in_a_promtool_test(tmp_path: Path) -> None:
    test = """\
rule_files: [rules.yaml]
tests:
  - name: the series ends at once
    interval: 1m
    input_series:
      - series: gone
        values: '1 stale'
    promql_expr_test:
      - expr: gone
        eval_time: 1m
        exp_samples: []
"""
    path = _small(tmp_path, rules=_PROMETHEUS_RULES, test=test)
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 0, result.stderr
    # A gap instead ('_') keeps the last sample for the 5 minute lookback: the same test fails.
    path.write_text(test.replace("'1 stale'", "'1 _'"))
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 1
    assert 'got: {__name__="gone"} 1E+00' in result.stderr


def test_alert_rule_test_with_healer_rules_names_the_file_line_and_key(tmp_path: Path) -> None:
    test = _SMALL_TEST + "    alert_rule_test:\n      - {eval_time: 3m, alertname: GpuTooHot}\n"
    path = _small(tmp_path, test=test)
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 1
    assert f"error: {path}:12: unsupported key 'alert_rule_test' with healer rule files:" in result.stderr


def test_healer_expectations_with_prometheus_rules_name_the_file_line_and_key(tmp_path: Path) -> None:
    test = _ALERT_TEST + "    exp_steps: []\n"
    path = _small(tmp_path, rules=_PROMETHEUS_RULES, test=test)
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 1
    line = len(test.splitlines())  # the last line: exp_steps of the second test
    assert f"error: {path}:{line}: unsupported key 'exp_steps' with Prometheus rule files" in result.stderr


def test_stale_in_a_test_healers_engine_checks_is_refused_at_its_line(tmp_path: Path) -> None:
    path = _small(tmp_path, test=_SMALL_TEST.replace("values: '90x5'", "values: '90x5 stale'"))
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 1
    assert f"error: {path}:6: values: 'stale' is not supported in a test with exp_findings" in result.stderr


def test_promql_expr_test_in_a_healer_test_runs_on_promtool(tmp_path: Path) -> None:
    promql = (
        "    promql_expr_test:\n"
        "      - expr: max(DCGM_FI_DEV_GPU_TEMP)\n"
        "        eval_time: 2m\n"
        "        exp_samples: [{labels: '{}', value: 90}]\n"
    )
    path = _small(tmp_path, test=_SMALL_TEST + promql)
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 0, result.stderr
    assert "OK: 1 of 1 test(s) passed in 1 file(s)" in result.stdout

    path.write_text(_SMALL_TEST + promql.replace("value: 90", "value: 91"))
    result = CliRunner().invoke(app, ["rules", "test", str(path)])
    assert result.exit_code == 1
    assert f"FAILED {path}:3: test 'hot GPU': promtool test rules:" in result.stderr
    assert "got: {} 9E+01" in result.stderr
    assert "FAIL: 0 of 1 test(s) passed in 1 file(s)" in result.stderr
