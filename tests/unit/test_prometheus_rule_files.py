"""Prometheus rule files as rule input: an alerting rule file in kube-prometheus / dcgm-exporter
style loads as healer rules, `healer rules export` loads back as the same rule set, and each
mistake is reported at the file's line, column and key. PromQL is checked by the real promtool.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from healer.cli import app
from healer.ruleset.export import healer_annotations, prometheus_rule_file
from healer.ruleset.loading import RECORDING_RULE_REFUSED, RuleProblem, load_ruleset, validate_rules
from healer.ruleset.schema import (
    DEFAULT_NODE_LABELS,
    DrainAction,
    PoolSpec,
    RecordingRule,
    Rule,
    RuleGroup,
    RuleSet,
    TicketAction,
)
from tests.conftest import REPO

#: What an SRE brings: dcgm-exporter's alerts as kube-prometheus writes them, plus healer's actions.
GPU_ALERTS = """\
groups:
  - name: dcgm-gpu.rules
    interval: 30s
    rules:
      - record: gpu:DCGM_FI_DEV_GPU_TEMP:max
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP)
      - alert: GPUHighTemperature
        expr: gpu:DCGM_FI_DEV_GPU_TEMP:max > 85
        for: 5m
        keep_firing_for: 10m
        labels:
          severity: critical
          team: gpu-infra
        annotations:
          summary: GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is hot
          description: "GPU {{ $labels.gpu }} has been above 85 C for 5 minutes (now {{ $value }} C)."
          runbook_url: https://runbooks.example.com/gpu/high-temperature
          healer_actions: "quarantine, drain: {timeout: 1h}, ticket: {provider: default}"
          healer_unit: degrees C
  - name: dcgm-xid.rules
    rules:
      - alert: GPUXidError
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_XID_ERRORS) > 0
        labels:
          severity: warning
        annotations:
          summary: GPU {{ $labels.gpu }} reported Xid {{ $value }}
"""

ALERTS_ONLY = """\
groups:
  - name: dcgm
    rules:
      - alert: GPUHighTemperature
        expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 85
        for: 5m
        labels: {severity: critical}
        annotations:
          summary: hot
          healer_actions: quarantine
"""


def write(tmp_path: Path, text: str, name: str = "gpu.rules.yml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path, *, recording_rules: bool = True) -> list[RuleProblem]:
    result = validate_rules([path], recording_rules=recording_rules)
    assert result.ruleset is None, "expected the set to be rejected"
    return list(result.problems)


# --- what a Prometheus rule file loads as ------------------------------------------------------------


def test_an_alerting_rule_file_loads_as_healer_rules(tmp_path: Path) -> None:
    result = validate_rules([write(tmp_path, GPU_ALERTS)], recording_rules=True)
    assert result.problems == () and result.promql_checked, result.problems
    assert result.warnings == ()
    assert result.ruleset is not None
    hot = result.ruleset.rule("GPUHighTemperature")
    assert (hot.expr, hot.for_, hot.keep_firing_for, hot.severity) == (
        "gpu:DCGM_FI_DEV_GPU_TEMP:max > 85",
        300.0,
        600.0,
        "critical",
    )
    assert hot.labels == {"team": "gpu-infra"}
    assert set(hot.annotations) == {"summary", "description", "runbook_url"}
    assert [a.kind for a in hot.actions] == ["quarantine", "drain", "ticket"]
    assert hot.actions[1] == DrainAction(timeout=3600.0)
    assert hot.actions[2] == TicketAction(provider="default")
    assert hot.unit == "degrees C"
    assert hot.node_labels == DEFAULT_NODE_LABELS  # no healer_node_labels: the default chain
    assert result.origins["GPUHighTemperature"].line == 7  # the `alert:` key

    (group, xid_group) = result.ruleset.groups
    assert group.records == [
        RecordingRule(
            record="gpu:DCGM_FI_DEV_GPU_TEMP:max", expr="max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP)"
        )
    ]
    assert (group.interval, xid_group.interval) == (30.0, None)


def test_an_alert_without_healer_actions_acts_on_nothing(tmp_path: Path) -> None:
    xid = load_ruleset([write(tmp_path, GPU_ALERTS)], recording_rules=True).rule("GPUXidError")
    assert xid.actions == [] and xid.ladder is None  # findings recorded and shown, no node touched
    assert xid.severity == "warning"


def test_severity_defaults_as_in_healers_own_format(tmp_path: Path) -> None:
    text = ALERTS_ONLY.replace("        labels: {severity: critical}\n", "")
    assert load_ruleset([write(tmp_path, text)]).rule("GPUHighTemperature").severity == "critical"


def test_an_organisations_own_severity_stays_a_label_and_round_trips(tmp_path: Path) -> None:
    """severity: page (or P1) is no healer severity: the alert keeps its label, healer's severity
    is healer_severity (default critical), and the export writes both back unchanged."""
    text = """\
    groups:
      - name: team
        rules:
          - alert: Paged
            expr: up == 0
            labels: {severity: page, team: ml}
          - alert: Ticketed
            expr: up == 0
            labels: {severity: P3}
            annotations: {healer_severity: info}
          - alert: Warned
            expr: up == 0
            labels: {severity: warning}
            annotations: {healer_severity: critical}
    """
    ruleset = load_ruleset([write(tmp_path, text)])
    paged, ticketed, warned = (ruleset.rule(n) for n in ("Paged", "Ticketed", "Warned"))
    assert (paged.severity, paged.labels) == ("critical", {"severity": "page", "team": "ml"})
    assert (ticketed.severity, ticketed.labels) == ("info", {"severity": "P3"})
    assert (warned.severity, warned.labels) == ("critical", {"severity": "warning"})  # the annotation says
    back = _through_export(ruleset, tmp_path)
    for name in ("Paged", "Ticketed", "Warned"):
        assert (back.rule(name).severity, back.rule(name).labels) == (
            ruleset.rule(name).severity,
            ruleset.rule(name).labels,
        )


def test_a_healer_severity_that_is_none_of_healers_is_refused_where_it_is(tmp_path: Path) -> None:
    text = """\
    groups:
      - name: team
        rules:
          - alert: Paged
            expr: up == 0
            annotations: {healer_severity: pager}
    """
    (problem,) = problems_of(write(tmp_path, text))
    assert (problem.line, problem.field) == (6, "groups[0].rules[0].annotations.healer_severity")
    assert "must be 'critical', 'warning' or 'info', not 'pager'" in problem.message


def test_healer_keys_come_from_their_annotations(tmp_path: Path) -> None:
    text = """\
    groups:
      - name: ib
        rules:
          - alert: IbLinkDown
            expr: node_infiniband_port_state != 5
            labels: {severity: warning}
            annotations:
              summary: down
              healer_actions: "[{quarantine: {scope: node}}, {taint: {effect: NoExecute}}]"
              healer_ladder: "reboot: {timeout: 30m}, ticket: {provider: acme, timeout: 3d}"
              healer_node_labels: node, instance
              healer_gpu_label: device
              healer_unit: port state
              healer_sticky: "true"
              healer_classify: xid-label
              healer_pool: "name: ib, node_selector: {feature.node.kubernetes.io/rdma.available: 'true'}"
    """
    rule = load_ruleset([write(tmp_path, text)]).rule("IbLinkDown")
    assert [a.kind for a in rule.actions] == ["quarantine", "taint"]
    assert [(s.kind, s.timeout) for s in rule.ladder or []] == [("reboot", 1800.0), ("ticket", 3 * 86400.0)]
    assert rule.node_labels == ("node", "instance")
    assert (rule.gpu_label, rule.unit, rule.sticky, rule.classify) == (
        "device",
        "port state",
        True,
        "xid-label",
    )
    assert rule.pool == PoolSpec(
        name="ib", node_selector={"feature.node.kubernetes.io/rdma.available": "true"}
    )
    assert rule.annotations == {"summary": "down"}


# --- export → load: the same rule set -----------------------------------------------------------


def _through_export(ruleset: RuleSet, tmp_path: Path) -> RuleSet:
    target = tmp_path / "exported.yml"
    YAML(typ="safe", pure=True).dump(prometheus_rule_file(ruleset, default_interval_seconds=30), target)
    result = validate_rules([target], recording_rules=True)
    assert result.problems == (), result.problems
    assert result.ruleset is not None
    return result.ruleset


def test_the_default_pack_exported_loads_back_as_the_same_rules(runner: CliRunner, tmp_path: Path) -> None:
    exported = runner.invoke(app, ["rules", "export", str(REPO / "rules")])
    assert exported.exit_code == 0, exported.output
    target = write(tmp_path, exported.stdout, "healer.rules.yml")
    pack = load_ruleset([REPO / "rules"])
    again = validate_rules([target])
    assert again.problems == () and again.warnings == ()
    assert again.ruleset is not None and again.ruleset.groups == pack.groups
    # And once more: the export of the loaded export is the same file.
    assert (
        runner.invoke(app, ["rules", "export", str(target)]).stdout.splitlines()[1:]
        == (exported.stdout.splitlines()[1:])
    )


def test_every_healer_key_survives_the_round_trip(tmp_path: Path) -> None:
    every = RuleSet(
        groups=(
            RuleGroup.model_validate(
                {
                    "name": "everything",
                    "interval": "1m",
                    "records": [
                        {"record": "gpu:temp:max", "expr": "max(DCGM_FI_DEV_GPU_TEMP)", "labels": {"a": "b"}}
                    ],
                    "rules": [
                        {
                            "name": "Xid",
                            "expr": "DCGM_FI_DEV_XID_ERRORS > 0",
                            "for": "90s",
                            "keep_firing_for": "1h30m",
                            "severity": "info",
                            "node_labels": ["node", "Hostname"],
                            "gpu_label": "minor_number",
                            "unit": "Xid code: the value",
                            "sticky": True,
                            "mode": "shadow",
                            "labels": {"team": "gpu", "tier": "1"},
                            "annotations": {"summary": "Xid {{ $value }}: look", "description": "true"},
                            "pool": {"name": "h100", "node_selector": {"nvidia.com/gpu.product": "H100"}},
                            "actions": [
                                {"quarantine": {"scope": "gpu", "taint_effect": "NoExecute"}},
                                {
                                    "drain": {
                                        "timeout": "2h",
                                        "checkpoint": "10m",
                                        "force": True,
                                        "grace_period": 30,
                                    }
                                },
                                {"ticket": {"provider": "acme", "template": "acme.json.j2"}},
                                {"ticket": {"provider": "other"}},
                                {"notify": {"message": "GPU {{ $labels.gpu }}: true, 30"}},
                            ],
                            "classify": "xid-value",
                            "ladder": [
                                "reset-gpu",
                                {"reboot": {"timeout": "45m"}},
                                {"ticket": {"provider": "acme"}},
                            ],
                        },
                        {"name": "Silent", "expr": "up == 0", "kind": "no_data", "actions": ["notify"]},
                        {
                            "name": "Degrade",
                            "expr": "up == 2",
                            "actions": [{"taint": {"effect": "PreferNoSchedule"}}],
                        },
                        {"name": "Watch", "expr": "up == 3"},
                    ],
                }
            ),
            RuleGroup.model_validate(
                {
                    "name": "pooled",
                    "interval": "30s",
                    "pool": {"node_selector": {"pool": "a100"}},
                    "rules": [{"name": "Pooled", "expr": "up == 4", "actions": ["quarantine"]}],
                }
            ),
            RuleGroup.model_validate(
                {
                    "name": "records-only",
                    "interval": "15s",
                    "records": [{"record": "r:up", "expr": "up"}],
                    "rules": [],
                }
            ),
        )
    )
    again = _through_export(every, tmp_path)
    assert again.groups[0] == every.groups[0]
    assert again.groups[2] == every.groups[2]
    # A Prometheus group has no annotations: the group's pool comes back as its rules' own.
    assert again.pools() == every.pools()
    assert again.groups[1].rules[0].pool == every.groups[1].pool


def test_annotations_say_only_what_differs_from_the_defaults() -> None:
    plain = Rule.model_validate({"name": "A", "expr": "up"})
    assert healer_annotations(plain, None) == {}
    acting = Rule.model_validate(
        {"name": "A", "expr": "up", "actions": ["quarantine", {"drain": {"timeout": "1h"}}, "ticket"]}
    )
    assert healer_annotations(acting, None) == {"healer_actions": "quarantine, drain: {timeout: 1h}, ticket"}


# --- recording rules -------------------------------------------------------------------------------


def test_recording_rules_are_refused_where_healer_evaluates_the_rules(tmp_path: Path) -> None:
    path = write(tmp_path, GPU_ALERTS)
    (problem,) = problems_of(path, recording_rules=False)
    assert (problem.line, problem.column, problem.field) == (5, 9, "groups[0].rules[0].record")
    assert problem.message == RECORDING_RULE_REFUSED
    assert str(problem).startswith(f"{path}:5:9: groups[0].rules[0].record: a recording rule: ")
    assert "detection.mode: alerts" in problem.message


def test_recording_rules_come_first_in_the_export(tmp_path: Path) -> None:
    text = """\
    groups:
      - name: g
        rules:
          - alert: Hot
            expr: gpu:temp:max > 85
            annotations: {summary: hot}
          - record: gpu:temp:max
            expr: max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)
    """
    ruleset = load_ruleset([write(tmp_path, text)], recording_rules=True)
    (group,) = prometheus_rule_file(ruleset, default_interval_seconds=30)["groups"]
    assert [r.get("record") or r["alert"] for r in group["rules"]] == ["gpu:temp:max", "Hot"]


def test_healers_own_format_has_no_recording_rules(tmp_path: Path) -> None:
    text = """\
    groups:
      - name: g
        records: [{record: a:b, expr: up}]
        rules:
          - {name: A, expr: up}
    """
    (problem,) = problems_of(write(tmp_path, text, "healer.yaml"))
    assert (problem.line, problem.field) == (3, "groups[0].records")
    assert "recording rules come from Prometheus rule files" in problem.message


# --- mistakes, each where it is ---------------------------------------------------------------------

# (case id, file text, (line, column, field, words in the message))
MISTAKES = [
    (
        "typo in a rule key",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                annotation: {summary: hot}
        """,
        (6, 9, "groups[0].rules[0].annotation", "unknown key 'annotation' (did you mean 'annotations'?)"),
    ),
    (
        "healer's actions as a rule key",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                actions: [quarantine]
        """,
        (6, 9, "groups[0].rules[0].actions", "healer's 'actions' is the annotation healer_actions"),
    ),
    (
        "typo in a healer annotation",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                annotations:
                  healer_action: quarantine
        """,
        (7, 11, "groups[0].rules[0].annotations.healer_action", "(did you mean 'healer_actions'?)"),
    ),
    (
        "unknown action in the annotation",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                annotations:
                  healer_actions: quarantine, reboot
        """,
        (7, 27, "groups[0].rules[0].annotations.healer_actions[1]", "unknown action 'reboot'"),
    ),
    (
        "bad drain option in the annotation",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                annotations:
                  healer_actions: "quarantine, drain: {timeout: soon}"
        """,
        (
            7,
            27,
            "groups[0].rules[0].annotations.healer_actions[1].drain.timeout",
            "not a Prometheus duration: 'soon'",
        ),
    ),
    (
        "drain without quarantine, at the annotation",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                annotations: {healer_actions: drain}
        """,
        (6, 23, "groups[0].rules[0].annotations.healer_actions", "drain needs quarantine first"),
    ),
    (
        "annotation that is no YAML flow list",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                annotations:
                  healer_actions: "quarantine, drain: {timeout: 1h"
        """,
        (7, 27, "groups[0].rules[0].annotations.healer_actions", "not a YAML flow list"),
    ),
    (
        "annotation that is not text",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                annotations:
                  healer_actions: [quarantine]
        """,
        (
            7,
            11,
            "groups[0].rules[0].annotations.healer_actions",
            "an annotation is text (Prometheus): quote it",
        ),
    ),
    (
        "aliases in an annotation",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                annotations:
                  healer_node_labels: "&a node, *a"
        """,
        (7, 31, "groups[0].rules[0].annotations.healer_node_labels", "without anchors or aliases"),
    ),
    (
        "healer_rule label of another rule",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
                labels: {healer_rule: Cold}
        """,
        (6, 18, "groups[0].rules[0].labels.healer_rule", "must be the alert's name 'Hot'"),
    ),
    (
        "alert name that cannot be a taint value",
        """\
        groups:
          - name: g
            rules:
              - alert: "gpu:hot"
                expr: up
                annotations: {healer_actions: quarantine}
        """,
        (4, 9, "groups[0].rules[0].alert", "rule name 'gpu:hot' becomes the taint's value"),
    ),
    (
        "bad for, after a recording rule (the file's index)",
        """\
        groups:
          - name: g
            rules:
              - record: a:b
                expr: up
              - alert: Hot
                expr: a:b > 1
                for: 5 minutes
        """,
        (8, 9, "groups[0].rules[1].for", "not a Prometheus duration: '5 minutes'"),
    ),
    (
        "missing expr",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
        """,
        (4, 9, "groups[0].rules[0].expr", "missing required key 'expr'"),
    ),
    (
        "alert and record",
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                record: a:b
                expr: up
        """,
        (5, 9, "groups[0].rules[0].record", "a rule has 'alert' or 'record', not both"),
    ),
    (
        "neither alert nor record",
        """\
        groups:
          - name: g
            rules:
              - record: a:b
                expr: up
              - expr: up
        """,
        (6, 9, "groups[0].rules[1].alert", "missing required key 'alert'"),
    ),
    (
        "for on a recording rule",
        """\
        groups:
          - name: g
            rules:
              - record: a:b
                expr: up
                for: 5m
        """,
        (6, 9, "groups[0].rules[0].for", "a recording rule has no 'for' (Prometheus refuses it)"),
    ),
    (
        "recording rule name that is no metric name",
        """\
        groups:
          - name: g
            rules:
              - record: a-b
                expr: up
        """,
        (4, 9, "groups[0].rules[0].record", "should match pattern"),
    ),
    (
        "PromQL of a recording rule",
        """\
        groups:
          - name: g
            rules:
              - record: a:b
                expr: sum(rate(x[5m])
        """,
        (5, 30, "groups[0].rules[0].expr", "PromQL parse error: unclosed left parenthesis"),
    ),
    (
        "PromQL of an alert after a recording rule",
        """\
        groups:
          - name: g
            rules:
              - record: a:b
                expr: up
              - alert: Hot
                expr: a:b >> 1
        """,
        (7, 20, "groups[0].rules[1].expr", "PromQL parse error: unexpected operator '>'"),
    ),
    (
        "a group's limit",
        """\
        groups:
          - name: g
            limit: 10
            rules:
              - {alert: Hot, expr: up}
        """,
        (3, 5, "groups[0].limit", "not supported by healer"),
    ),
    (
        "a group's pool",
        """\
        groups:
          - name: g
            pool: {node_selector: {a: b}}
            rules:
              - {alert: Hot, expr: up}
        """,
        (3, 5, "groups[0].pool", "give its rules the annotation healer_pool"),
    ),
]


@pytest.mark.parametrize(("text", "expected"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_each_mistake_is_reported_where_it_is(
    tmp_path: Path, text: str, expected: tuple[int, int, str, str]
) -> None:
    path = write(tmp_path, text)
    line, column, field, words = expected
    (problem,) = problems_of(path)
    assert (problem.line, problem.column, problem.field) == (line, column, field), str(problem)
    assert words in problem.message, str(problem)
    assert str(problem).startswith(f"{path}:{line}:{column}: {field}: ")


def test_a_healer_rule_among_prometheus_rules_is_told_how_to_write_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        groups:
          - name: g
            rules:
              - alert: Hot
                expr: up
              - name: Cold
                expr: up
                actions: [quarantine]
        """,
    )
    assert [str(p).removeprefix(f"{path}:") for p in problems_of(path)] == [
        "6:9: groups[0].rules[1].name: unknown key 'name': a Prometheus rule file names an alerting rule "
        "with 'alert:'",
        "6:9: groups[0].rules[1].alert: missing required key 'alert'",
        "8:9: groups[0].rules[1].actions: unknown key 'actions': in a Prometheus rule file healer's "
        "'actions' is the annotation healer_actions",
    ]


def test_duplicate_names_across_a_healer_and_a_prometheus_file(tmp_path: Path) -> None:
    write(
        tmp_path, "groups:\n  - name: a\n    rules:\n      - {name: GPUHighTemperature, expr: up}\n", "a.yaml"
    )
    second = write(tmp_path, ALERTS_ONLY, "b.yml")
    (problem,) = problems_of(tmp_path)
    assert str(problem) == (
        f"{second}:4:9: groups[0].rules[0].alert: duplicate rule name 'GPUHighTemperature': "
        f"also defined at {tmp_path / 'a.yaml'}:4:10"
    )


def test_a_stale_digest_is_a_warning_that_names_alerts_mode(tmp_path: Path) -> None:
    ruleset = load_ruleset([write(tmp_path, ALERTS_ONLY)])
    exported = tmp_path / "exported.yml"
    YAML(typ="safe", pure=True).dump(prometheus_rule_file(ruleset, default_interval_seconds=30), exported)
    assert validate_rules([exported]).warnings == ()
    exported.write_text(exported.read_text().replace("> 85", "> 80"))
    result = validate_rules([exported])
    assert result.ruleset is not None  # the rules load: healer's digest is computed, not read
    (warning,) = result.warnings
    assert "rule 'GPUHighTemperature': healer_rule_digest" in warning
    assert "alerts mode refuses the rule until Prometheus loads a new export" in warning


# --- the commands ------------------------------------------------------------------------------------


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in list(os.environ):
        if key.startswith("HEALER_"):
            monkeypatch.delenv(key)
    return CliRunner()


def test_validate_and_show_read_a_prometheus_rule_file(runner: CliRunner, tmp_path: Path) -> None:
    path = write(tmp_path, ALERTS_ONLY)
    validated = runner.invoke(app, ["rules", "validate", str(path)])
    assert validated.exit_code == 0, validated.output
    assert validated.stdout == "OK: 1 rule in 1 group from 1 file\n"
    shown = runner.invoke(app, ["rules", "show", "-o", "json", str(path)])
    assert shown.exit_code == 0, shown.output
    (rule,) = json.loads(shown.stdout)["rules"]
    assert (rule["name"], rule["for"], rule["severity"]) == ("GPUHighTemperature", "5m", "critical")
    assert [a["kind"] for a in rule["actions"]] == ["quarantine"]


def test_recording_rules_pass_validate_in_alerts_mode_only(runner: CliRunner, tmp_path: Path) -> None:
    path = write(tmp_path, GPU_ALERTS)
    refused = runner.invoke(app, ["rules", "validate", str(path)])
    assert refused.exit_code == 1
    assert f"{path}:5:9: groups[0].rules[0].record: a recording rule: " in refused.stderr
    alerts = {"HEALER_DETECTION__MODE": "alerts"}
    validated = runner.invoke(app, ["rules", "validate", str(path)], env=alerts)
    assert validated.exit_code == 0, validated.output
    assert validated.stdout == "OK: 2 rules and 1 recording rule in 2 groups from 1 file\n"
    shown = runner.invoke(app, ["rules", "show", str(path)], env=alerts)
    assert shown.exit_code == 0, shown.output
    assert "gpu:DCGM_FI_DEV_GPU_TEMP:max" in shown.stdout and "(recording rule)" in shown.stdout
    # Export writes them whatever the mode: Prometheus evaluates them.
    exported = runner.invoke(app, ["rules", "export", str(path)])
    assert exported.exit_code == 0, exported.output
    (group, _) = YAML(typ="safe").load(exported.stdout)["groups"]
    assert group["rules"][0] == {
        "record": "gpu:DCGM_FI_DEV_GPU_TEMP:max",
        "expr": "max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP)",
    }


def test_the_keep_list_keeps_what_recording_rules_read(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["rules", "scrape-keep", str(write(tmp_path, GPU_ALERTS))])
    assert result.exit_code == 0, result.output
    (entry,) = YAML(typ="safe").load(result.stdout)["metric_relabel_configs"]
    assert entry["regex"] == "DCGM_FI_DEV_GPU_TEMP|DCGM_FI_DEV_XID_ERRORS|up"
