"""Rule loading: every mistake reported at once, each with its file, line, column and field.

The PromQL checks run the real ``promtool`` (Debian package ``prometheus``), as CI installs it.
"""

from __future__ import annotations

import csv
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from healer.errors import RuleError
from healer.ruleset.loading import (
    RuleProblem,
    load_ruleset,
    reload_ruleset,
    to_prometheus_rules,
    validate_rules,
)
from healer.ruleset.schema import RuleSet
from tests.conftest import REPO

PACK = REPO / "rules"
COUNTERS_CSV = {line: REPO / "deploy" / "dcgm-exporter" / f"counters-{line}.csv" for line in ("3.x", "4.x")}
FIXTURES = REPO / "tests" / "fixtures"

GOOD_RULE = """\
groups:
  - name: gpu
    interval: 30s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 5m
        annotations: {summary: hot}
        actions: [quarantine]
"""


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(*paths: Path, promtool: str | bool = True) -> list[RuleProblem]:
    result = validate_rules(list(paths), promtool=promtool)
    assert result.ruleset is None, "expected the set to be rejected"
    return list(result.problems)


# --- the default pack ---------------------------------------------------------------------------


def test_default_pack_loads_with_promql_checked() -> None:
    result = validate_rules([PACK])
    assert result.problems == ()
    assert result.warnings == ()
    assert result.promql_checked
    assert result.ruleset is not None
    assert len(result.files) >= 5
    names = {r.name for r in result.ruleset.rules}
    for expected in (
        "GpuTooHot",
        "GpuThermalMarginLow",
        "GpuHardwareSlowdown",
        "GpuPowerBrake",
        "GpuSilentThrottling",
        "GpuFatalXid",
        "GpuRowRemapFailure",
        "GpuMissing",
        "NvlinkErrorBurst",
        "InfinibandLinkDowned",
        "DcgmExporterSilent",
    ):
        assert expected in names


def test_default_pack_rules_are_explained_and_remediated() -> None:
    ruleset = load_ruleset([PACK])
    for rule in ruleset.rules:
        assert rule.summary and "\n" not in rule.summary, rule.name
        assert rule.unit, rule.name
        assert rule.actions, rule.name
        kinds = {a.kind for a in rule.actions}
        if rule.kind == "no_data":
            assert kinds == {"notify"}, rule.name
        elif rule.severity == "critical":
            assert {"quarantine", "ticket"} <= kinds, rule.name
        # GPU utilisation says a kernel ran, not that the GPU is healthy: never a signal.
        assert "DCGM_FI_DEV_GPU_UTIL" not in rule.expr, rule.name


#: Rules that count a node's GPUs or ports: their finding is the node, no single GPU or port.
NODE_WIDE = {"GpuMissing", "InfinibandPortMissing"}


def test_default_pack_keeps_node_and_gpu_identity_in_every_result() -> None:
    for rule in load_ruleset([PACK]).rules:
        if rule.name in NODE_WIDE:
            assert rule.expr.startswith("count by (") and "max_over_time(" in rule.expr, rule.name
            continue
        if "node_infiniband_" in rule.expr and rule.kind == "fault":
            assert "device, port" in rule.expr, rule.name
            assert "Hostname" not in rule.node_labels, rule.name
        elif "DCGM_" in rule.expr and rule.kind == "fault":
            assert "gpu, UUID, pci_bus_id, modelName" in rule.expr, rule.name


def test_default_pack_as_prometheus_rules_passes_promtool(tmp_path: Path) -> None:
    target = tmp_path / "prometheus-rules.yml"
    YAML(typ="safe", pure=True).dump(to_prometheus_rules(load_ruleset([PACK])), target)
    done = subprocess.run(["promtool", "check", "rules", str(target)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(load_ruleset([PACK]).rules)} rules found" in done.stdout


def _expand_alternatives(pattern: str) -> list[str]:
    """``A_(B|C)_D|E`` → ``[A_B_D, A_C_D, E]`` (the only regex forms the pack uses in names)."""
    group = re.search(r"\(([^()]*)\)", pattern)
    if group is None:
        return pattern.split("|")
    return [
        name
        for alt in group.group(1).split("|")
        for name in _expand_alternatives(pattern[: group.start()] + alt + pattern[group.end() :])
    ]


def _csv_fields(path: Path) -> dict[str, str]:
    """The counters CSV as {field name: metric type}, checking dcgm-exporter's line format."""
    fields: dict[str, str] = {}
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    for row in csv.reader(lines, skipinitialspace=True):
        # dcgm-exporter reads this with encoding/csv: exactly three fields, no comma in the help.
        assert len(row) == 3, row
        name, kind, help_text = row
        assert kind in ("gauge", "counter", "label"), row
        assert help_text
        assert name not in fields, f"{path.name}: {name} twice"
        fields[name] = kind
    return fields


def _known_fields(line: str) -> set[str]:
    """The DCGM field names exporter ``line`` knows (tests/fixtures/dcgm-fields-<line>.txt).

    Sources (each file's header has the detail): 3.x from NVIDIA/dcgm-exporter's 3.x ``pkg/cmd/app.go``
    (field 112 as ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``, the ``DCGM_EXP_*`` collectors) and its 2.x/3.x
    ``etc/default-counters.csv``, ids from DCGM's ``dcgm_fields.h``; 4.x from NVIDIA/go-dcgm
    ``pkg/dcgm/const_fields.go``, the table 4.x exporters resolve CSV names against.
    """
    rows = (FIXTURES / f"dcgm-fields-{line}.txt").read_text().splitlines()
    return {row.split()[1] for row in rows if row.strip() and not row.startswith("#")}


def _fields_read_by_pack() -> list[set[str]]:
    """Each DCGM metric the pack reads, as the set of names that stand for it (a name regex lists
    alternatives, such as field 112's 3.x and 4.x names)."""
    read: list[set[str]] = []
    for rule in load_ruleset([PACK]).rules:
        for pattern in re.findall(r'__name__=~"([^"]+)"', rule.expr):
            read.append({n for n in _expand_alternatives(pattern) if n.startswith("DCGM_")})
        plain = re.sub(r'__name__=~"[^"]+"', "", rule.expr)
        read.extend({n} for n in re.findall(r"DCGM_(?:FI|EXP)_[A-Z0-9_]+", plain))
    return [names for names in read if names]


@pytest.mark.parametrize("line", ["3.x", "4.x"])
def test_counters_csv_names_only_fields_its_exporter_line_knows(line: str) -> None:
    # An exporter refuses to start when its CSV names a field its DCGM does not know: the whole
    # node loses GPU metrics. So each CSV is held to the field list of its own exporter line.
    fields = _csv_fields(COUNTERS_CSV[line])
    unknown = set(fields) - _known_fields(line)
    assert not unknown, f"counters-{line}.csv: fields dcgm-exporter {line} does not know: {sorted(unknown)}"


def test_field_112_has_one_name_per_exporter_line() -> None:
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" in _csv_fields(COUNTERS_CSV["3.x"])
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" not in _known_fields("3.x")
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" in _csv_fields(COUNTERS_CSV["4.x"])
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in _known_fields("4.x")


@pytest.mark.parametrize("line", ["3.x", "4.x"])
def test_counters_csv_enables_every_dcgm_field_the_rules_read(line: str) -> None:
    fields = _csv_fields(COUNTERS_CSV[line])
    known = _known_fields(line)
    read = _fields_read_by_pack()
    assert read, "the pack reads dcgm-exporter metrics"
    for names in read:
        if not names & known:
            continue  # a field this exporter line lacks (e.g. 1523 on 3.x): the rule falls back
        assert names & set(fields), f"counters-{line}.csv enables none of {sorted(names)}"
    for name in set(fields):
        expected = "counter" if name.endswith("_TOTAL") or "VOL_TOTAL" in name else None
        if expected:
            assert fields[name] == expected, name


# --- one mistake, one problem in the right place -----------------------------------------------

# (case id, file text, (line, column, field, words in the message))
MISTAKES = [
    (
        "bad duration",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                for: 5 minutes
        """,
        (6, 9, "groups[0].rules[0].for", "not a Prometheus duration: '5 minutes'"),
    ),
    (
        "bad keep_firing_for",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                keep_firing_for: -1m
        """,
        (6, 9, "groups[0].rules[0].keep_firing_for", "not a Prometheus duration"),
    ),
    (
        "bad group interval",
        """\
        groups:
          - name: gpu
            interval: 0s
            rules:
              - {name: A, expr: up}
        """,
        (3, 5, "groups[0].interval", "greater than 0"),
    ),
    (
        "unknown rule key with suggestion",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                sevrity: warning
        """,
        (6, 9, "groups[0].rules[0].sevrity", "unknown key 'sevrity' (did you mean 'severity'?)"),
    ),
    (
        "healer's name in a Prometheus rule (alert: makes it one)",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                alert: A
                expr: up
        """,
        (4, 9, "groups[0].rules[0].name", "a Prometheus rule file names an alerting rule with 'alert:'"),
    ),
    (
        "unknown group key",
        """\
        groups:
          - name: gpu
            limit: 10
            rules:
              - {name: A, expr: up}
        """,
        (3, 5, "groups[0].limit", "unknown key 'limit'"),
    ),
    (
        "unknown top-level key",
        """\
        groups:
          - name: gpu
            rules:
              - {name: A, expr: up}
        version: 2
        """,
        (5, 1, "version", "unknown key 'version'"),
    ),
    (
        "unknown action name",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                actions: [quarantine, reboot]
        """,
        (6, 31, "groups[0].rules[0].actions[1]", "unknown action 'reboot'"),
    ),
    (
        "unknown action mapping",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                actions:
                  - reboot: {force: true}
        """,
        (7, 13, "groups[0].rules[0].actions[0]", "unknown action 'reboot'"),
    ),
    (
        "bad drain timeout",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                actions:
                  - quarantine
                  - drain: {timeout: soon}
        """,
        (8, 21, "groups[0].rules[0].actions[1].drain.timeout", "not a Prometheus duration: 'soon'"),
    ),
    (
        "unknown drain option (kind form)",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                actions:
                  - quarantine
                  - kind: drain
                    grace: 30
        """,
        (9, 13, "groups[0].rules[0].actions[1].grace", "unknown key 'grace'"),
    ),
    (
        "drain without quarantine",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                actions: [drain]
        """,
        (6, 9, "groups[0].rules[0].actions", "drain needs quarantine first"),
    ),
    (
        "no_data rule that acts",
        """\
        groups:
          - name: exporter
            rules:
              - name: A
                kind: no_data
                expr: up == 0
                actions: [quarantine]
        """,
        (7, 9, "groups[0].rules[0].actions", "a no_data rule may only notify"),
    ),
    (
        "empty expression",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: "  "
        """,
        (5, 9, "groups[0].rules[0].expr", "expr must not be empty"),
    ),
    (
        "missing expression points at the rule",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                for: 5m
        """,
        (4, 9, "groups[0].rules[0].expr", "missing required key 'expr'"),
    ),
    (
        "missing groups",
        """\
        {}
        """,
        (1, 1, "groups", "missing required key 'groups'"),
    ),
    (
        "empty node label chain",
        """\
        groups:
          - name: ib
            rules:
              - name: A
                expr: up
                node_labels: []
        """,
        (6, 9, "groups[0].rules[0].node_labels", "at least one label"),
    ),
    (
        "empty node label name",
        """\
        groups:
          - name: ib
            rules:
              - name: A
                expr: up
                node_labels: [node, ""]
        """,
        (6, 9, "groups[0].rules[0].node_labels", "not a Prometheus label name: ''"),
    ),
    (
        "expression of the wrong type",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: [up]
        """,
        (5, 9, "groups[0].rules[0].expr", "valid string"),
    ),
    (
        "label value of the wrong type",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                labels:
                  team: gpu
                  tier: 1
        """,
        (8, 11, "groups[0].rules[0].labels.tier", "valid string"),
    ),
    (
        "label name that YAML reads as a number",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                labels: {5: x}
        """,
        (6, 18, "groups[0].rules[0].labels.5", "key must be a string, got int 5"),
    ),
    (
        "duration that YAML reads as a date",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                for: 2024-01-01
        """,
        (6, 9, "groups[0].rules[0].for", "not a Prometheus duration"),
    ),
    (
        "mistake merged in from an anchor is reported at the anchor",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
              - <<: &slow {for: 5 minutes}
                name: B
                expr: up == 0
        """,
        (6, 20, "groups[0].rules[1].for", "not a Prometheus duration: '5 minutes'"),
    ),
    (
        "actions not a list",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                actions: quarantine
        """,
        (6, 9, "groups[0].rules[0].actions", "expected a list"),
    ),
    (
        "unknown severity",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                severity: page
        """,
        (6, 9, "groups[0].rules[0].severity", "must be 'critical', 'warning' or 'info', not 'page'"),
    ),
    (
        "empty rule list",
        """\
        groups:
          - name: gpu
            rules: []
        """,
        (3, 5, "groups[0].rules", "must not be empty"),
    ),
    (
        "duplicate rule name in one file",
        """\
        groups:
          - name: gpu
            rules:
              - {name: A, expr: up}
              - name: A
                expr: up == 0
        """,
        (5, 9, "groups[0].rules[1].name", "duplicate rule name 'A': also defined at {file}:4:10"),
    ),
    (
        "PromQL syntax, one-line expression",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: sum(rate(x[5m])
        """,
        (5, 30, "groups[0].rules[0].expr", "PromQL parse error: unclosed left parenthesis"),
    ),
    (
        "PromQL syntax, inside a literal block",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: |
                  max by (Hostname) (
                    DCGM_FI_DEV_GPU_TEMP
                  ) >> 78
        """,
        (8, 14, "groups[0].rules[0].expr", "PromQL parse error: unexpected operator '>'"),
    ),
    (
        "PromQL bad duration inside the expression",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: 'rate(x[5 minutes])'
        """,
        (5, 23, "groups[0].rules[0].expr", "PromQL parse error: missing unit character in duration"),
    ),
    (
        "annotation template",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                annotations:
                  summary: "GPU {{ $labels.gpu "
        """,
        (7, 11, "groups[0].rules[0].annotations.summary", "template: unclosed action"),
    ),
    (
        "label name Prometheus refuses",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                labels: {bad-name: x}
        """,
        (6, 9, "groups[0].rules[0].labels", "invalid label name: bad-name"),
    ),
    (
        "rule name that cannot be a taint value",
        """\
        groups:
          - name: gpu
            rules:
              - name: "gpu:xid"
                expr: up
                actions: [quarantine]
        """,
        # the name is what to change: the error points at the `name:` line, not at `actions:`
        (4, 9, "groups[0].rules[0].name", "rule name 'gpu:xid' becomes the taint's value"),
    ),
    (
        "YAML syntax",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: "up
        """,
        (6, 1, "", "YAML syntax error"),
    ),
    (
        "YAML duplicate key",
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up
                expr: down
        """,
        (6, 9, "", "duplicate key"),
    ),
    (
        "not a mapping",
        """\
        - name: gpu
        """,
        (1, 1, "", "expected a mapping with 'groups', got a list"),
    ),
]


@pytest.mark.parametrize(("text", "expected"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_each_mistake_is_reported_where_it_is(
    tmp_path: Path, text: str, expected: tuple[int, int, str, str]
) -> None:
    path = write(tmp_path, text)
    line, column, field, words = expected
    (problem,) = problems_of(path)
    assert (problem.file, problem.line, problem.column, problem.field) == (str(path), line, column, field), (
        str(problem)
    )
    assert words.format(file=path) in problem.message
    assert str(problem).startswith(f"{path}:{line}:{column}: {field + ': ' if field else ''}")


def test_a_duplicate_key_names_the_key_and_its_first_line_not_its_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        groups:
          - name: gpu
            rules:
              - name: A
                expr: up == 0
            rules:
              - name: B
                expr: up == 1
        """,
    )
    (problem,) = problems_of(path)
    assert str(problem) == f"{path}:6:5: duplicate key 'rules' (first at line 3)"


def test_three_mistakes_give_three_problems_in_file_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        groups:
          - name: gpu
            rules:
              - name: GpuTooHot
                expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78
                for: 5 minutes
              - name: GpuXid
                expr: DCGM_FI_DEV_XID_ERRORS == == 79
                actions: [quarantine, reboot]
        """,
    )
    with pytest.raises(RuleError) as caught:
        load_ruleset([path])
    assert [str(p) for p in caught.value.problems] == [
        f"{path}:6:9: groups[0].rules[0].for: not a Prometheus duration: '5 minutes' "
        "(use e.g. 30s, 5m, 1h30m)",
        f"{path}:8:41: groups[0].rules[1].expr: PromQL parse error: unexpected operator '=='",
        f"{path}:9:31: groups[0].rules[1].actions[1]: unknown action 'reboot' "
        "(allowed: quarantine, taint, drain, ticket, notify)",
    ]
    assert str(caught.value) == "\n".join(str(p) for p in caught.value.problems)


def test_duplicate_names_across_files_name_both_places(tmp_path: Path) -> None:
    first = write(tmp_path, GOOD_RULE, "a.yaml")
    second = write(
        tmp_path,
        """\
        groups:
          - name: more
            rules:
              - name: Other
                expr: up
              - name: GpuTooHot
                expr: up == 0
          - name: gpu
            rules:
              - {name: Third, expr: up}
        """,
        "b.yml",
    )
    problems = problems_of(tmp_path)
    assert [str(p) for p in problems] == [
        f"{second}:6:9: groups[0].rules[1].name: "
        f"duplicate rule name 'GpuTooHot': also defined at {first}:5:9",
        f"{second}:8:5: groups[1].name: duplicate group name 'gpu': also defined at {first}:2:5",
    ]


def test_every_file_of_a_set_is_checked_and_the_whole_set_rejected(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD_RULE, "good.yaml")
    bad = write(
        tmp_path,
        GOOD_RULE.replace("GpuTooHot", "Other")
        .replace("name: gpu", "name: g2")
        .replace("for: 5m", "for: 5 mins"),
        "bad.yaml",
    )
    result = validate_rules([good, bad])
    assert result.ruleset is None
    assert [p.file for p in result.problems] == [str(bad)]


# --- files and directories -----------------------------------------------------------------------


def test_a_directory_loads_its_yaml_and_yml_files_in_name_order(tmp_path: Path) -> None:
    write(tmp_path, GOOD_RULE, "b.yml")
    write(tmp_path, GOOD_RULE.replace("GpuTooHot", "Hot2").replace("name: gpu", "name: gpu2"), "a.yaml")
    write(tmp_path, "not: [rules", ".editor-backup.yaml")
    write(tmp_path, "not rules at all", "README.md")
    ruleset = load_ruleset([tmp_path])
    assert [g.name for g in ruleset.groups] == ["gpu2", "gpu"]
    assert ruleset.sources == (str(tmp_path / "a.yaml"), str(tmp_path / "b.yml"))
    # Naming a file of the directory as well loads it once (no duplicate-name error).
    assert len(load_ruleset([tmp_path, tmp_path / "a.yaml"]).rules) == 2


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no such file or directory"),
        ("empty dir", "directory holds no *.yaml or *.yml rule file"),
        ("empty file", "empty file: expected a mapping with 'groups'"),
    ],
)
def test_paths_that_hold_no_rules_are_problems(tmp_path: Path, setup: str, message: str) -> None:
    if setup == "missing":
        target = tmp_path / "nope.yaml"
    elif setup == "empty dir":
        target = tmp_path / "empty"
        target.mkdir()
    else:
        target = write(tmp_path, "# nothing here\n")
    (problem,) = problems_of(target)
    assert problem == RuleProblem(str(target), None, None, "", message)
    assert str(problem) == f"{target}: {message}"


def test_no_path_at_all_is_a_problem() -> None:
    (problem,) = validate_rules([]).problems
    assert "no rule file or directory given" in problem.message


# --- promtool ------------------------------------------------------------------------------------


def test_without_promtool_loading_warns_and_skips_the_promql_check(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_RULE.replace("> 78", ">> 78"))
    result = validate_rules([path], promtool=str(tmp_path / "no-promtool-here"))
    assert result.ruleset is not None  # the broken PromQL went unnoticed, and we say so
    assert not result.promql_checked
    assert len(result.warnings) == 1 and "PromQL syntax NOT checked" in result.warnings[0]
    # With promtool, the same file is refused.
    assert problems_of(path)[0].field == "groups[0].rules[0].expr"


def test_promql_check_can_be_turned_off(tmp_path: Path) -> None:
    result = validate_rules([write(tmp_path, GOOD_RULE)], promtool=False)
    assert result.ruleset is not None and not result.promql_checked and result.warnings == ()


def test_promql_is_checked_even_in_rules_with_other_mistakes(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        groups:
          - name: gpu
            rules:
              - expr: up ==
                severity: page
        """,
    )
    fields = sorted(p.field for p in problems_of(path))
    assert fields == ["groups[0].rules[0].expr", "groups[0].rules[0].name", "groups[0].rules[0].severity"]


def test_a_rule_without_summary_is_a_warning_not_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_RULE.replace("        annotations: {summary: hot}\n", ""))
    result = validate_rules([path])
    assert result.ruleset is not None
    assert result.warnings == (f"{path}:5:9: rule 'GpuTooHot' has no 'summary' annotation",)


# --- reload keeps the old set --------------------------------------------------------------------


def test_reload_with_a_bad_file_keeps_the_previous_rule_set(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_RULE)
    previous = load_ruleset([path])
    path.write_text(GOOD_RULE.replace("for: 5m", "for: soon"))
    outcome = reload_ruleset([path], previous)
    assert not outcome.ok
    assert outcome.ruleset is previous
    assert outcome.error is not None and outcome.error.problems[0].field == "groups[0].rules[0].for"

    path.write_text(GOOD_RULE.replace("for: 5m", "for: 10m"))
    outcome = reload_ruleset([path], previous)
    assert outcome.ok and isinstance(outcome.ruleset, RuleSet)
    assert outcome.ruleset.rule("GpuTooHot").for_ == 600.0


def test_loaded_rules_hold_durations_in_seconds_and_actions_normalised(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        groups:
          - name: gpu
            interval: 1m
            rules:
              - name: A
                expr: |
                  up == 0
                for: 1h30m
                keep_firing_for: 90
                actions:
                  - quarantine
                  - drain: {timeout: 45m, delete_emptydir_data: true}
                  - kind: ticket
                    provider: acme
        """,
    )
    ruleset = load_ruleset([path])
    (group,) = ruleset.groups
    rule = group.rules[0]
    assert (group.interval, rule.for_, rule.keep_firing_for, rule.expr) == (60.0, 5400.0, 90.0, "up == 0")
    assert [a.kind for a in rule.actions] == ["quarantine", "drain", "ticket"]
    assert rule.actions[1].timeout == 2700.0  # type: ignore[union-attr]
    assert rule.actions[2].provider == "acme"  # type: ignore[union-attr]


# --- rule pools (pool: node_selector) --------------------------------------------------------------


POOLED = """\
groups:
  - name: ib
    pool:
      name: infiniband
      node_selector: {feature.node.kubernetes.io/rdma.available: "true"}
    rules:
      - name: IbPortDown
        expr: node_infiniband_port_state != 5
        annotations: {summary: down}
        actions: [quarantine]
      - name: GpuTooHot
        expr: DCGM_FI_DEV_GPU_TEMP > 78
        annotations: {summary: hot}
        pool:
          name: h100
          node_selector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
        actions: [quarantine]
"""


def test_a_pool_named_by_node_labels_loads(tmp_path: Path) -> None:
    ruleset = load_ruleset([write(tmp_path, POOLED)], promtool=False)
    pools = ruleset.pools()
    assert pools["IbPortDown"].name == "infiniband"  # the group's
    assert pools["GpuTooHot"].node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_a_bad_node_selector_is_reported_with_its_place(tmp_path: Path) -> None:
    text = POOLED.replace("nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3", '"Bad Key": "not a value!"')
    (problem,) = problems_of(write(tmp_path, text), promtool=False)
    assert (problem.line, problem.field) == (16, "groups[0].rules[1].pool.node_selector")
    assert "label key 'Bad Key'" in problem.message and "label value 'not a value!'" in problem.message


def test_a_pool_needs_a_selector(tmp_path: Path) -> None:
    text = POOLED.replace('      node_selector: {feature.node.kubernetes.io/rdma.available: "true"}\n', "")
    (problem,) = problems_of(write(tmp_path, text), promtool=False)
    assert problem.field == "groups[0].pool.node_selector"


def test_one_pool_name_selects_one_set_of_nodes(tmp_path: Path) -> None:
    other = POOLED.replace("name: h100", "name: infiniband")
    (problem,) = problems_of(write(tmp_path, other), promtool=False)
    assert (problem.line, problem.field) == (15, "groups[0].rules[1].pool.name")
    assert problem.message.startswith("pool 'infiniband' selects other nodes than at ")
    assert ":4:" in problem.message  # the first definition's line


@pytest.mark.parametrize(
    ("promtool", "readable"),
    [
        ("parse error: unexpected <op:>>", "parse error: unexpected operator '>'"),
        ("unexpected <op:>=> in x", "unexpected operator '>=' in x"),
        ("unexpected <aggr:sum>, expected x", "unexpected aggregation 'sum', expected x"),
        ("unexpected <by> in aggregation", "unexpected keyword 'by' in aggregation"),
        ('unexpected "}" in label matching', 'unexpected "}" in label matching'),
    ],
)
def test_promql_errors_spell_out_the_parsers_token_notation(promtool: str, readable: str) -> None:
    from healer.ruleset.loading import readable_promql_error

    assert readable_promql_error(promtool) == readable
