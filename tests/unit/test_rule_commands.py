"""``healer rules validate`` and ``healer rules show`` as a user runs them (CliRunner; real promtool)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from healer.cli import app
from tests.conftest import REPO

THREE_MISTAKES = """\
groups:
  - name: gpu
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 5 minutes
        annotations: {summary: hot}
      - name: GpuXid
        expr: DCGM_FI_DEV_XID_ERRORS == == 79
        annotations: {summary: xid}
        actions: [quarantine, reboot]
"""


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    # Settings come from the environment: keep a developer's HEALER_* out of the test.
    for key in list(os.environ):
        if key.startswith("HEALER_"):
            monkeypatch.delenv(key)
    return CliRunner()


@pytest.fixture
def three_mistakes(tmp_path: Path) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(THREE_MISTAKES)
    return path


def test_validate_the_default_pack_exits_0_with_a_summary(runner: CliRunner) -> None:
    result = runner.invoke(app, ["rules", "validate", str(REPO / "rules")])
    assert result.exit_code == 0, result.output
    assert re.fullmatch(r"OK: \d+ rules in \d+ groups from \d+ files\n", result.stdout)
    assert result.stderr == ""


def test_validate_defaults_to_the_rules_paths_setting(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, three_mistakes: Path
) -> None:
    monkeypatch.setenv("HEALER_RULES_PATHS", json.dumps([str(three_mistakes)]))
    result = runner.invoke(app, ["rules", "validate"])
    assert result.exit_code == 1
    assert str(three_mistakes) in result.stderr


def test_three_mistakes_exit_1_with_three_lines_naming_file_line_and_field(
    runner: CliRunner, three_mistakes: Path
) -> None:
    result = runner.invoke(app, ["rules", "validate", str(three_mistakes)])
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines == [
        f"{three_mistakes}:6:9: groups[0].rules[0].for: not a Prometheus duration: '5 minutes' "
        "(use e.g. 30s, 5m, 1h30m)",
        f"{three_mistakes}:9:41: groups[0].rules[1].expr: PromQL parse error: unexpected operator '=='",
        f"{three_mistakes}:11:31: groups[0].rules[1].actions[1]: unknown action 'reboot' "
        "(allowed: quarantine, taint, drain, ticket, notify)",
    ]


def test_validate_json_lists_every_error(runner: CliRunner, three_mistakes: Path) -> None:
    result = runner.invoke(app, ["rules", "validate", "--format", "json", str(three_mistakes)])
    assert result.exit_code == 1
    body = json.loads(result.stdout)
    assert body["valid"] is False
    assert body["rules"] == 0
    assert [(e["file"], e["line"], e["column"], e["field"]) for e in body["errors"]] == [
        (str(three_mistakes), 6, 9, "groups[0].rules[0].for"),
        (str(three_mistakes), 9, 41, "groups[0].rules[1].expr"),
        (str(three_mistakes), 11, 31, "groups[0].rules[1].actions[1]"),
    ]
    assert all(e["message"] for e in body["errors"])


def test_validate_json_of_a_good_pack(runner: CliRunner) -> None:
    result = runner.invoke(app, ["rules", "validate", "-o", "json", str(REPO / "rules")])
    assert result.exit_code == 0
    body = json.loads(result.stdout)
    assert body["valid"] is True and body["errors"] == [] and body["promql_checked"] is True
    assert body["rules"] >= 20


def test_show_table_lists_each_rule_with_its_timing_and_actions(runner: CliRunner) -> None:
    result = runner.invoke(app, ["rules", "show", str(REPO / "rules")])
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["GROUP", "RULE", "INTERVAL", "FOR", "KEEP", "SEVERITY", "ACTIONS", "EXPR"]
    hot = next(r for r in rows if " GpuTooHot " in r)
    assert re.match(
        r"gpu-thermal +GpuTooHot +30s +5m +10m +critical +"
        r"quarantine, drain\(timeout=1h, delete_emptydir_data=True\), ticket ",
        hot,
    )
    assert "DCGM_FI_DEV_GPU_TEMP" in hot
    silent = next(r for r in rows if " DcgmExporterSilent " in r)
    assert "warning (no data)" in silent and " notify " in silent


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_show_json_and_yaml_give_the_effective_rules(runner: CliRunner, fmt: str) -> None:
    result = runner.invoke(app, ["rules", "show", "--format", fmt, str(REPO / "rules")])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout) if fmt == "json" else YAML(typ="safe").load(result.stdout)
    hot = next(r for r in body["rules"] if r["name"] == "GpuTooHot")
    assert hot["group"] == "gpu-thermal"
    assert (hot["interval"], hot["for"], hot["keep_firing_for"], hot["severity"]) == (
        "30s",
        "5m",
        "10m",
        "critical",
    )
    assert hot["actions"] == [
        {"kind": "quarantine", "taint_effect": "NoSchedule", "scope": "node"},
        {
            "kind": "drain",
            "timeout": "1h",
            "grace_period": -1,
            "delete_emptydir_data": True,
            "ignore_daemonsets": True,
            "force": False,
            "delete_after_timeout": False,
            "concurrency": 8,
            "checkpoint": "0s",
        },
        {"kind": "ticket", "provider": "default", "template": None},
    ]
    assert "DCGM_FI_DEV_GPU_TEMP" in hot["expr"]
    assert hot["summary"]


def test_show_uses_the_default_interval_for_groups_without_one(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            groups:
              - name: g
                rules:
                  - {name: A, expr: up == 0, annotations: {summary: down}}
            """
        )
    )
    env = {"HEALER_SCHEDULER__DEFAULT_INTERVAL_SECONDS": "45"}
    result = runner.invoke(app, ["rules", "show", "-o", "json", str(path)], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rules"][0]["interval"] == "45s"


def test_show_refuses_an_invalid_set(runner: CliRunner, three_mistakes: Path) -> None:
    result = runner.invoke(app, ["rules", "show", str(three_mistakes)])
    assert result.exit_code == 1
    assert len(result.stderr.splitlines()) == 3


def test_the_installed_console_script_validates_the_pack() -> None:
    healer = Path(sys.executable).with_name("healer")
    done = subprocess.run(
        [str(healer), "rules", "validate", "rules/"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OK: ")


def test_validate_warns_about_a_rule_that_keeps_no_node_label(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "blind.yaml"
    path.write_text(
        "groups:\n  - name: g\n    rules:\n      - name: GpuTooHot\n"
        "        expr: sum by (gpu) (DCGM_FI_DEV_GPU_TEMP) > 80\n        annotations: {summary: hot}\n"
    )
    result = runner.invoke(app, ["rules", "validate", str(path)])
    assert result.exit_code == 0, result.output  # a warning, not an error
    assert result.stderr == (
        f"warning: {path}:5:9: rule 'GpuTooHot': the expression keeps only (gpu): none of its "
        "node_labels nor instance (Hostname, hostname, node, kubernetes_node, nodename, instance), "
        "so no finding can name its node (keep one in the outer by (...))\n"
    )


def test_validate_with_settings_names_an_unconfigured_ticket_provider(
    runner: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "tickets.yaml"
    path.write_text(
        "groups:\n  - name: g\n    rules:\n      - name: GpuTooHot\n"
        "        expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 80\n"
        "        annotations: {summary: hot}\n        actions: [quarantine, {ticket: {provider: nosuch}}]\n"
    )
    settings = tmp_path / "settings.yaml"
    settings.write_text("tickets: {providers: []}\n")

    without = runner.invoke(app, ["rules", "validate", str(path)])
    assert without.exit_code == 0, without.output
    assert without.stderr == ""  # no settings given: which providers exist is not known

    result = runner.invoke(app, ["--config", str(settings), "rules", "validate", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"warning: {path}:4:9: rule GpuTooHot opens tickets with provider 'nosuch', "
        "which tickets.providers does not configure\n"
    )
