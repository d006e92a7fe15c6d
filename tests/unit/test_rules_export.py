"""``healer rules export``: the rule pack as Prometheus loads it; ``healer rules scrape-keep``: the
metric_relabel_configs that keeps what the pack reads (CliRunner; real promtool)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from api.charts import METRICS as CHART_METRICS
from healer.backtesting import DEFAULT_FLEET_QUERY
from healer.cli import app
from healer.ruleset.export import DIGEST_ANNOTATION, RULE_LABEL, rule_digest
from healer.ruleset.inputs import input_metrics, unlisted_selectors
from healer.ruleset.loading import load_ruleset
from tests.conftest import REPO
from tests.service_skips import require_binary

PACK = REPO / "rules"


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in list(os.environ):
        if key.startswith("HEALER_"):
            monkeypatch.delenv(key)
    return CliRunner()


def promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)


def test_export_writes_a_rule_file_promtool_accepts(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["rules", "export", str(PACK)])
    assert result.exit_code == 0, result.output
    target = tmp_path / "healer.rules.yml"
    target.write_text(result.stdout)
    done = promtool_check(target)
    assert done.returncode == 0, done.stdout + done.stderr
    pack = load_ruleset([PACK])
    assert f"SUCCESS: {len(pack.rules)} rules found" in done.stdout

    doc = YAML(typ="safe").load(result.stdout)
    assert [g["name"] for g in doc["groups"]] == [g.name for g in pack.groups]
    assert all(g["interval"] == "30s" for g in doc["groups"])
    exported = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    assert set(exported) == {r.name for r in pack.rules}
    for rule in pack.rules:
        item = exported[rule.name]
        assert item["expr"].strip() == rule.expr
        assert item["labels"][RULE_LABEL] == rule.name
        assert item["labels"]["severity"] == rule.severity
        assert item["annotations"][DIGEST_ANNOTATION] == rule_digest(rule)
        assert item["annotations"]["summary"] == rule.summary
    assert exported["GpuTooHot"]["for"] == "5m" and exported["GpuTooHot"]["keep_firing_for"] == "10m"
    assert exported["GpuFatalXid"]["keep_firing_for"] == "30m" and "for" not in exported["GpuFatalXid"]


def test_export_prometheus_rule_object(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "rules", "export", str(PACK), "--prometheus-rule",
            "--name", "gpu-health", "--namespace", "monitoring", "--label", "release=kps",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = YAML(typ="safe").load(result.stdout)
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == "PrometheusRule"
    assert doc["metadata"] == {
        "name": "gpu-health",
        "namespace": "monitoring",
        "labels": {"app.kubernetes.io/name": "healer", "release": "kps"},
    }
    # The operator writes spec as the rule file Prometheus loads: promtool must accept it.
    target = tmp_path / "spec.yml"
    YAML(typ="safe").dump({"groups": doc["spec"]["groups"]}, target)
    done = promtool_check(target)
    assert done.returncode == 0, done.stdout + done.stderr


def test_export_refuses_invalid_rules(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - name: X\n        expr: up == == 1\n")
    result = runner.invoke(app, ["rules", "export", str(bad)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "bad.yaml:5" in result.stderr


def test_export_interval_defaults_to_the_scheduler_interval(runner: CliRunner, tmp_path: Path) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text("groups:\n  - name: g\n    rules:\n      - name: X\n        expr: up == 0\n")
    result = runner.invoke(
        app, ["rules", "export", str(plain)], env={"HEALER_SCHEDULER__DEFAULT_INTERVAL_SECONDS": "45"}
    )
    assert result.exit_code == 0, result.output
    (group,) = YAML(typ="safe").load(result.stdout)["groups"]
    assert group["interval"] == "45s"


def test_export_without_keep_firing_for_is_what_vmalert_1_79_loads(runner: CliRunner, tmp_path: Path) -> None:
    full = runner.invoke(app, ["rules", "export", "--no-promql", str(PACK)])
    bare = runner.invoke(app, ["rules", "export", "--no-promql", "--no-keep-firing-for", str(PACK)])
    assert full.exit_code == bare.exit_code == 0, full.output + bare.output
    assert "keep_firing_for" in full.stdout and "keep_firing_for" not in bare.stdout
    yaml = YAML(typ="safe")
    full_rules = [r for g in yaml.load(full.stdout)["groups"] for r in g["rules"]]
    bare_rules = [r for g in yaml.load(bare.stdout)["groups"] for r in g["rules"]]
    # Same rules, same digests (healer's rules are unchanged): only the field is left out.
    assert [{k: v for k, v in r.items() if k != "keep_firing_for"} for r in full_rules] == bare_rules
    for name, text in (("full", full.stdout), ("bare", bare.stdout)):
        (tmp_path / f"{name}.yml").write_text(text)
    vmalert = require_binary("vmalert", package="victoria-metrics")

    def dry_run(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [vmalert, f"-rule={tmp_path / name}", "-dryRun"], capture_output=True, text=True, timeout=60
        )

    assert dry_run("bare.yml").returncode == 0
    refused = dry_run("full.yml")
    if refused.returncode == 0:
        pytest.skip("this vmalert (1.94+) knows keep_firing_for")
    assert "keep_firing_for" in refused.stdout + refused.stderr


def keep_regex(stdout: str) -> re.Pattern[str]:
    """The keep rule of the output, as the engine applies it (anchored at both ends)."""
    doc = YAML(typ="safe").load(stdout)
    (entry,) = doc["metric_relabel_configs"]
    assert entry["action"] == "keep" and entry["source_labels"] == ["__name__"]
    return re.compile(f"^(?:{entry['regex']})$")


def test_keep_list_keeps_every_metric_the_pack_reads_and_drops_the_rest(runner: CliRunner) -> None:
    result = runner.invoke(app, ["rules", "scrape-keep", str(PACK)])
    assert result.exit_code == 0, result.output
    keep = keep_regex(result.stdout)
    pack = load_ruleset([PACK])
    for rule in pack.rules:
        for name in input_metrics(rule.expr):
            assert keep.match(name), f"{rule.name} reads {name}, which the keep-list drops"
    # What healer reads besides the rules: the dashboard's default charts, the backtest's fleet.
    for chart in CHART_METRICS:
        assert keep.match(chart.metric)
    assert keep.match(DEFAULT_FLEET_QUERY.rsplit("(", 1)[1].rstrip(")"))
    assert keep.match("up")
    # Series no rule reads (the simulator's and a real exporter's) are dropped.
    for unread in (
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_POWER_USAGE",
        "node_infiniband_info",
        "node_cpu_seconds_total",
    ):
        assert not keep.match(unread)
    # A name only a prefix of a kept one is not kept (the regex is anchored).
    assert not keep.match("DCGM_FI_DEV_GPU_TEMP_EXTRA") and not keep.match("DCGM_FI_DEV_GPU")


def test_keep_list_is_valid_in_a_prometheus_scrape_job(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["rules", "scrape-keep", str(PACK), "--also", "node_load1"])
    assert result.exit_code == 0, result.output
    assert keep_regex(result.stdout).match("node_load1")
    job = {"job_name": "dcgm-exporter", "static_configs": [{"targets": ["127.0.0.1:9400"]}]}
    job.update(YAML(typ="safe").load(result.stdout))
    config = tmp_path / "prometheus.yml"
    with config.open("w") as out:
        YAML(typ="safe").dump({"scrape_configs": [job]}, out)
    done = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_a_rule_selecting_by_pattern_has_no_keep_list(runner: CliRunner, tmp_path: Path) -> None:
    rules = tmp_path / "pattern.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    rules:\n"
        "      - name: AnyDcgm\n        expr: 'count by (Hostname) ({__name__=~\"DCGM_.*\"}) > 1000'\n"
        "      - name: Plain\n        expr: up == 0\n"
    )
    result = runner.invoke(app, ["rules", "scrape-keep", str(rules), "--no-promql"])
    assert result.exit_code == 1
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "AnyDcgm" in error and "Plain" not in error
    assert result.stdout == ""


def test_bad_also_name_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["rules", "scrape-keep", str(PACK), "--no-promql", "--also", "not a name"])
    assert result.exit_code == 2
    assert "not a name" in result.stderr


def test_unlisted_selectors_counts_what_cannot_be_named() -> None:
    assert unlisted_selectors("DCGM_FI_DEV_GPU_TEMP > 80") == 0
    assert unlisted_selectors('{__name__=~"A|B"} > 0') == 0
    assert unlisted_selectors('{__name__=~"DCGM_.*"} or {job="x"}') == 2
