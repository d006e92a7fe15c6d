"""The InfiniBand device filter: one setting (``infiniband.device_include``/``device_exclude``) says
which HCAs count, and every ``node_infiniband_*`` selector of every loaded, shown and exported rule
carries it (healer.ruleset.device_filter; rules/README.md "Which InfiniBand devices count")."""

from __future__ import annotations

import os
from pathlib import Path

import promql_parser
import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from healer.cli import app
from healer.config import load_settings
from healer.errors import ConfigError
from healer.ruleset.device_filter import (
    ALL_DEVICES,
    DeviceFilter,
    DeviceMatcherConflict,
    apply_device_filter,
)
from healer.ruleset.loading import load_ruleset, validate_rules
from tests.conftest import REPO

PACK = REPO / "rules"
#: promql-parser's match operators (by their text) as PromQL writes them.
OPS = {"MatchOp.Re": "=~", "MatchOp.NotRe": "!~", "MatchOp.Equal": "=", "MatchOp.NotEqual": "!="}
MANAGEMENT = DeviceFilter(include="mlx5_.*", exclude="mlx5_(bond_.*|9)")


def device_matchers(expr: str) -> list[set[tuple[str, str]]]:
    """Each node_infiniband_* selector's device matchers, as (operator, value), parsed by promql-parser."""
    out: list[set[tuple[str, str]]] = []

    def walk(node: object) -> None:
        if isinstance(node, promql_parser.MatrixSelector):
            node = node.vector_selector
        if isinstance(node, promql_parser.VectorSelector):
            if node.name and node.name.startswith("node_infiniband_"):
                out.append({(OPS[str(m.op)], m.value) for m in node.matchers.matchers if m.name == "device"})
            return
        for attr in ("lhs", "rhs", "expr", "param"):
            child = getattr(node, attr, None)
            if child is not None:
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)

    walk(promql_parser.parse(expr))
    return out


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No developer's HEALER_* variables: the settings are the test's own."""
    for key in list(os.environ):
        if key.startswith("HEALER_"):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.fixture
def runner(environment: pytest.MonkeyPatch) -> CliRunner:
    return CliRunner()


def test_the_pack_writes_no_device_matcher_the_setting_is_the_only_place() -> None:
    for path in sorted(PACK.glob("*.yaml")):
        for group in YAML(typ="safe").load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                assert all(not found for found in device_matchers(rule["expr"])), (path.name, rule["name"])


def test_every_infiniband_selector_of_every_loaded_rule_carries_the_setting() -> None:
    wanted = {("=~", MANAGEMENT.include), ("!~", MANAGEMENT.exclude)}
    selectors = 0
    for rule in load_ruleset([PACK], device_filter=MANAGEMENT).rules:
        for found in device_matchers(rule.expr):
            assert found == wanted, rule.name
            selectors += 1
    # every InfiniBand rule, and the exporter-silence rule on node_infiniband_state_id
    assert selectors >= 20


def test_the_default_counts_every_device() -> None:
    for rule in load_ruleset([PACK], promtool=False).rules:
        for found in device_matchers(rule.expr):
            assert found == {("=~", ".+"), ("!~", "")}, rule.name


def test_rules_without_infiniband_selectors_are_left_as_written() -> None:
    plain = {r.name: r.expr for r in load_ruleset([PACK], promtool=False).rules}
    filtered = {r.name: r.expr for r in load_ruleset([PACK], promtool=False, device_filter=MANAGEMENT).rules}
    for name, expr in plain.items():
        if "node_infiniband_" not in expr and "healer_agent_infiniband_" not in expr:
            assert filtered[name] == expr


def write_rule(tmp_path: Path, selector: str) -> Path:
    path = tmp_path / "fabric.yaml"
    path.write_text(
        "groups:\n"
        "  - name: fabric\n"
        "    rules:\n"
        "      - name: PortDown\n"
        "        expr: |\n"
        "          max by (node, device, port) (\n"
        f"            {selector}\n"
        "          ) != 4\n"
        "        annotations: {summary: down}\n"
        "        actions: [notify]\n",
        encoding="utf-8",
    )
    return path


def test_a_rule_that_sets_device_otherwise_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = write_rule(tmp_path, 'node_infiniband_state_id{device!~"mlx5_9"}')
    v = validate_rules([path], promtool=False, device_filter=MANAGEMENT)
    assert v.ruleset is None
    (problem,) = v.problems
    assert (problem.file, problem.line, problem.column) == (str(path), 7, 13)
    assert problem.field == "groups[0].rules[0].expr"
    assert 'device!~"mlx5_9"' in problem.message and "infiniband.device_exclude" in problem.message
    assert str(problem).startswith(f"{path}:7:13: groups[0].rules[0].expr: node_infiniband_state_id selects")


def test_a_rule_that_writes_the_settings_own_matchers_loads(tmp_path: Path) -> None:
    path = write_rule(tmp_path, 'node_infiniband_state_id{device=~"mlx5_.*", device!~"mlx5_(bond_.*|9)"}')
    (rule,) = load_ruleset([path], promtool=False, device_filter=MANAGEMENT).rules
    assert device_matchers(rule.expr) == [{("=~", "mlx5_.*"), ("!~", "mlx5_(bond_.*|9)")}]
    # The old pack's default matchers under a non-default setting: two places disagree.
    path = write_rule(tmp_path, 'node_infiniband_state_id{device=~".+", device!~""}')
    assert not validate_rules([path], promtool=False, device_filter=MANAGEMENT).ok


def test_other_matchers_stay_and_strings_comments_and_label_lists_are_untouched() -> None:
    expr = (
        'count by (node_infiniband_x) (node_infiniband_state_id{port="1"})  # node_infiniband_y\n'
        "  or label_replace(rate(node_infiniband_rate_total[5m:1m] offset 1m),"
        ' "a", "node_infiniband_z", "", "")'
    )
    out = apply_device_filter(expr, MANAGEMENT)
    assert out == (
        'count by (node_infiniband_x) (node_infiniband_state_id{device=~"mlx5_.*", '
        'device!~"mlx5_(bond_.*|9)", port="1"})  # node_infiniband_y\n'
        '  or label_replace(rate(node_infiniband_rate_total{device=~"mlx5_.*", device!~"mlx5_(bond_.*|9)"}'
        '[5m:1m] offset 1m), "a", "node_infiniband_z", "", "")'
    )
    assert apply_device_filter("up == 0", MANAGEMENT) == "up == 0"


def test_selectors_the_filter_cannot_be_written_into_are_refused_with_the_reason() -> None:
    with pytest.raises(DeviceMatcherConflict, match="before the braces"):
        apply_device_filter('{__name__="node_infiniband_state_id"} != 4', ALL_DEVICES)
    with pytest.raises(DeviceMatcherConflict, match="alternatives inside braces") as caught:
        apply_device_filter('up or node_infiniband_state_id{port="1" or port="2"} != 4', ALL_DEVICES)
    assert caught.value.offset == len("up or ")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("(?=mlx5)", "illegal regex"),
        ("mlx5_(", "illegal regex"),
        (r"(a)\1", "illegal regex"),
        ("a{1001}", "repeat count"),
        ("(?x)mlx5", "RE2 knows only"),
    ],
)
def test_a_regex_prometheus_would_refuse_is_a_settings_error_naming_the_variable(
    environment: pytest.MonkeyPatch, value: str, why: str
) -> None:
    environment.setenv("HEALER_INFINIBAND__DEVICE_EXCLUDE", value)
    with pytest.raises(ConfigError, match=why) as caught:
        load_settings()
    assert str(caught.value).startswith("HEALER_INFINIBAND__DEVICE_EXCLUDE: infiniband.device_exclude:")


def test_an_empty_include_is_refused(environment: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "healer.yaml"
    config.write_text('infiniband: {device_include: ""}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"infiniband.device_include: .*matches no device"):
        load_settings(config)


def test_quotes_and_backslashes_in_a_regex_are_escaped_not_pasted() -> None:
    f = DeviceFilter(include=r"mlx5_\d+", exclude='a"b')
    out = apply_device_filter("node_infiniband_state_id != 4", f)
    assert out == r'node_infiniband_state_id{device=~"mlx5_\\d+", device!~"a\"b"} != 4'
    assert device_matchers(out) == [{("=~", r"mlx5_\d+"), ("!~", 'a"b')}]


def test_show_and_export_carry_the_setting(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "healer.yaml"
    config.write_text('infiniband: {device_exclude: "mlx5_(bond_.*|9)"}\n', encoding="utf-8")
    shown = runner.invoke(app, ["--config", str(config), "rules", "show", str(PACK)])
    assert shown.exit_code == 0, shown.output
    assert 'node_infiniband_state_id{device=~".+", device!~"mlx5_(bond_.*|9)"}' in shown.output
    exported = runner.invoke(app, ["--config", str(config), "rules", "export", str(PACK)])
    assert exported.exit_code == 0, exported.output
    groups = YAML(typ="safe").load(exported.stdout)["groups"]
    infiniband = [r for g in groups for r in g["rules"] if "node_infiniband_" in r["expr"]]
    assert infiniband
    for rule in infiniband:
        assert all(m == {("=~", ".+"), ("!~", "mlx5_(bond_.*|9)")} for m in device_matchers(rule["expr"])), (
            rule["alert"]
        )


def test_an_infiniband_rule_the_filter_cannot_be_written_into_never_loads_unfiltered(tmp_path: Path) -> None:
    path = write_rule(tmp_path, "node_infiniband_state_id{port=")  # broken PromQL
    without_promtool = validate_rules([path], promtool=False)
    assert without_promtool.ruleset is None
    (problem,) = without_promtool.problems
    assert problem.field == "groups[0].rules[0].expr"
    assert "InfiniBand device filter could not be written" in problem.message
    # promtool names the syntax error itself: one problem for one mistake, not two.
    with_promtool = validate_rules([path])
    assert [p.field for p in with_promtool.problems] == ["groups[0].rules[0].expr"]
    assert "InfiniBand" not in with_promtool.problems[0].message
