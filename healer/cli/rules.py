"""``healer rules ...``: validate rule files and show the effective rule set.

Rule files are healer's format or Prometheus rule files (docs/rules.md, "Prometheus rule files").
Recording rules are accepted where Prometheus evaluates them: by ``export`` and ``scrape-keep``
always, by ``validate`` and ``show`` in alerts mode (``detection.mode``).

Exit status: 0 valid, 1 invalid rule files (every problem on stderr, one per line), 2 bad usage or
settings.
"""

from __future__ import annotations

import io
import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from healer.cli.context import require_rule_paths, settings_from
from healer.cli.output import FormatAlias, Output, OutputOption, chosen, table_width
from healer.cli.tables import columns

if TYPE_CHECKING:
    from healer.ruleset.loading import Validation
    from healer.ruleset.schema import Rule, RuleGroup, RuleSet

app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Rule files: validate them, show what they do."
)


class ValidateFormat(StrEnum):
    text = "text"
    json = "json"


Paths = Annotated[
    list[Path] | None,
    typer.Argument(help="Rule files or directories (default: the rules_paths setting).", show_default=False),
]
NoPromql = Annotated[
    bool, typer.Option("--no-promql", help="Do not check PromQL with promtool (schema checks only).")
]


def _validate(
    ctx: typer.Context, paths: list[Path] | None, no_promql: bool, *, recording_rules: bool | None = None
) -> Validation:
    """The rule files checked; ``recording_rules`` None: accepted in alerts mode (the settings')."""
    from healer.ruleset.loading import validate_rules

    given = bool(paths)
    settings = settings_from(ctx)
    if not paths:
        paths = list(settings.rules_paths)
    group = ctx.parent.info_name if ctx.parent is not None else "rules"
    usage = f"give them as arguments (`healer {group} {ctx.info_name} PATH...`)"
    require_rule_paths(paths, given=given, usage=usage)
    if recording_rules is None:
        recording_rules = settings.detection.recording_rules
    return validate_rules(
        paths,
        promtool=not no_promql,
        recording_rules=recording_rules,
        device_filter=settings.infiniband.device_filter(),
    )


def _valid(ctx: typer.Context, paths: list[Path] | None, no_promql: bool) -> Validation:
    """:func:`_validate` for commands that write from a valid rule set, recording rules included
    (Prometheus evaluates them): warnings on stderr; on any problem every one on stderr and exit 1
    (nothing written)."""
    v = _validate(ctx, paths, no_promql, recording_rules=True)
    for warning in v.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if not v.ok or v.ruleset is None:
        for problem in v.problems:
            typer.echo(str(problem), err=True)
        raise typer.Exit(1)
    return v


def _provider_warnings(ctx: typer.Context, v: Validation) -> list[str]:
    """With a settings file (``--config``): each ticket provider the rules name that
    ``tickets.providers`` lacks, at the first asking rule's place."""
    if v.ruleset is None or not (ctx.find_root().obj or {}).get("config"):
        return []
    from healer.tickets.coverage import describe, missing_providers

    out = []
    for missing in missing_providers(v.ruleset.rules, settings_from(ctx).tickets):
        origin = v.origins.get(missing.rules[0])
        out.append(f"{origin}: {describe(missing)}" if origin else describe(missing))
    return out


def _summary(v: Validation) -> str:
    rs = v.ruleset
    assert rs is not None
    n_files = len(v.files)
    records = f" and {len(rs.records)} recording rule{'s' * (len(rs.records) != 1)}" if rs.records else ""
    n_cap = len(rs.capacity)
    capacity = f", {n_cap} capacity rule{'s' * (n_cap != 1)}" if n_cap else ""
    return (
        f"{len(rs.rules)} rule{'s' * (len(rs.rules) != 1)}{records} in {len(rs.groups)} "
        f"group{'s' * (len(rs.groups) != 1)}{capacity} from {n_files} file{'s' * (n_files != 1)}"
    )


@app.command()
def validate(
    ctx: typer.Context,
    paths: Paths = None,
    output: Annotated[
        ValidateFormat, typer.Option("--output", "-o", "--format", help="text, or json for machines.")
    ] = ValidateFormat.text,
    no_promql: NoPromql = False,
) -> None:
    """Check rule files: every problem with file, line, column and field; exit 1 if any."""
    v = _validate(ctx, paths, no_promql)
    warnings = [*v.warnings, *_provider_warnings(ctx, v)]
    if output is ValidateFormat.json:
        body = {
            "valid": v.ok,
            "rules": len(v.ruleset.rules) if v.ruleset else 0,
            "groups": len(v.ruleset.groups) if v.ruleset else 0,
            "files": list(v.files),
            "promql_checked": v.promql_checked,
            "errors": [p.as_dict() for p in v.problems],
            "warnings": warnings,
        }
        typer.echo(json.dumps(body, indent=2))
    else:
        for warning in warnings:
            typer.echo(f"warning: {warning}", err=True)
        for problem in v.problems:
            typer.echo(str(problem), err=True)
        if v.ok:
            checked = "" if v.promql_checked else " (PromQL not checked)"
            typer.echo(f"OK: {_summary(v)}{checked}")
    if not v.ok:
        raise typer.Exit(1)


def _action_text(action: Any) -> str:
    """``drain(timeout=1h, force=True)``: options that differ from their defaults, and the deadline."""
    from healer.ruleset.schema import step_options

    options = step_options(action, everything=False)
    if not options:
        return str(action.kind)
    return f"{action.kind}({', '.join(f'{k}={v}' for k, v in options.items())})"


def _rule_record(group: RuleGroup, rule: Rule, default_interval: float) -> dict[str, Any]:
    from healer.ruleset.durations import format_duration
    from healer.ruleset.schema import step_options

    return {
        "group": group.name,
        "name": rule.name,
        "interval": format_duration(group.interval or default_interval),
        "for": format_duration(rule.for_),
        "keep_firing_for": format_duration(rule.keep_firing_for),
        "severity": rule.severity,
        "kind": rule.kind,
        "node_labels": list(rule.node_labels),
        "unit": rule.unit,
        "summary": rule.summary,
        "actions": [{"kind": a.kind, **step_options(a, everything=True)} for a in rule.actions],
        "expr": rule.expr,
    }


@app.command()
def show(
    ctx: typer.Context,
    paths: Paths = None,
    output: OutputOption = Output.TABLE,
    format_alias: FormatAlias = None,
    no_promql: NoPromql = False,
) -> None:
    """The effective rule set: per rule its group, interval, for, keep_firing_for, severity,
    actions and expression (interval falls back to scheduler.default_interval_seconds); then the
    recording rules of Prometheus rule files (alerts mode), which Prometheus evaluates."""
    v = _validate(ctx, paths, no_promql)
    for warning in v.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if v.ruleset is None:
        for problem in v.problems:
            typer.echo(str(problem), err=True)
        raise typer.Exit(1)
    from healer.ruleset.durations import format_duration

    ruleset: RuleSet = v.ruleset
    default_interval = settings_from(ctx).scheduler.default_interval_seconds
    records = [_rule_record(g, r, default_interval) for g in ruleset.groups for r in g.rules]
    recording = [
        {"group": g.name, "record": r.record, "expr": r.expr, "labels": dict(r.labels)}
        for g in ruleset.groups
        for r in g.records
    ]
    output = chosen(output, format_alias=format_alias)
    if output is Output.JSON:
        body = {"files": list(v.files), "rules": records, "recording_rules": recording}
        typer.echo(json.dumps(body, indent=2))
    elif output is Output.YAML:
        from ruamel.yaml import YAML
        from ruamel.yaml.scalarstring import LiteralScalarString

        yaml = YAML(typ="rt")  # keeps the record's key order
        yaml.width = 4096  # keep one-line summaries on one line
        for rec in [*records, *recording]:
            if "\n" in rec["expr"]:
                rec["expr"] = LiteralScalarString(rec["expr"] + "\n")
        buf = io.StringIO()
        yaml.dump({"files": list(v.files), "rules": records, "recording_rules": recording}, buf)
        typer.echo(buf.getvalue(), nl=False)
    else:
        rows = [["GROUP", "RULE", "INTERVAL", "FOR", "KEEP", "SEVERITY", "ACTIONS", "EXPR"]]
        for g in ruleset.groups:
            for r in g.rules:
                rec = _rule_record(g, r, default_interval)
                expr = " ".join(r.expr.split())
                rows.append(
                    [
                        g.name,
                        r.name,
                        rec["interval"],
                        rec["for"],
                        rec["keep_firing_for"],
                        r.severity + (" (no data)" if r.kind == "no_data" else ""),
                        ", ".join(_action_text(a) for a in r.actions) or "-",
                        expr,
                    ]
                )
        for g in ruleset.groups:
            for record in g.records:
                interval = format_duration(g.interval or default_interval)
                expr = " ".join(record.expr.split())
                rows.append([g.name, record.record, interval, "-", "-", "-", "(recording rule)", expr])
        typer.echo(columns(rows, width=table_width(output)))
        typer.echo(f"\n{_summary(v)}")


def _test_files(paths: list[Path]) -> list[Path]:
    """Files as given; a directory stands for its ``*.yaml``/``*.yml`` files (sorted, not recursive)."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()))
        else:
            out.append(path)
    return out


@app.command("test")
def test_(
    ctx: typer.Context,
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Rule test files, or directories of them (e.g. rules/tests).", show_default=False
        ),
    ],
) -> None:
    """Unit-test rules. promtool's test files (Prometheus rule files with alert:/record:,
    alert_rule_test, promql_expr_test) are run by promtool as written, a verdict per test; healer's
    (healer rule files, input_series 'a+bxn', exp_findings and exp_steps) by a throwaway Prometheus
    and healer's engine, with any promql_expr_test run by promtool.

    Exit 0 when every test passes; 1 with every failure (file:line, test, expected vs got) on stderr.
    """
    from healer.ruletest.runner import run

    files = _test_files(paths)
    if not files:  # directories without a test file: nothing would run, which is no pass
        where = ", ".join(str(p.resolve()) for p in paths)
        typer.echo(
            f"error: no rule test files (*.yaml, *.yml) in {where} (the repository's are in rules/tests)",
            err=True,
        )
        raise typer.Exit(1)
    outcome = run(files, device_filter=settings_from(ctx).infiniband.device_filter())
    for warning in outcome.warnings:
        typer.echo(f"warning: {warning}", err=True)
    for error in outcome.errors:
        typer.echo(f"error: {error}", err=True)
    for failure in outcome.failures:
        typer.echo(f"FAILED {failure}", err=True)
    failed_tests = len({(f.where.split(":")[0], f.test) for f in outcome.failures})
    summary = f"{outcome.tests - failed_tests} of {outcome.tests} test(s) passed in {len(files)} file(s)"
    if outcome.files_not_run:
        summary += f"; {outcome.files_not_run} file(s) not run (errors above)"
    if outcome.ok:
        typer.echo(f"OK: {summary}")
        return
    typer.echo(f"FAIL: {summary}", err=True)
    raise typer.Exit(1)


def _label_pairs(values: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            typer.echo(f"error: --label wants KEY=VALUE, not {value!r}", err=True)
            raise typer.Exit(2)
        out[key] = val
    return out


@app.command("export")
def export(
    ctx: typer.Context,
    paths: Paths = None,
    prometheus_rule: Annotated[
        bool,
        typer.Option(
            "--prometheus-rule",
            help="Write a monitoring.coreos.com/v1 PrometheusRule object (Prometheus Operator) "
            "instead of a plain rule file.",
        ),
    ] = False,
    name: Annotated[str, typer.Option(help="PrometheusRule: metadata.name.")] = "healer-rules",
    namespace: Annotated[
        str | None, typer.Option(help="PrometheusRule: metadata.namespace (default: none written).")
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="PrometheusRule: a metadata label KEY=VALUE (repeat); match your Prometheus's ruleSelector.",
        ),
    ] = None,
    no_promql: NoPromql = False,
    no_keep_firing_for: Annotated[
        bool,
        typer.Option(
            "--no-keep-firing-for",
            help="Leave keep_firing_for out, for engines that reject it (vmalert before 1.94, "
            "Prometheus before 2.42): healer then holds firing alerts itself.",
        ),
    ] = False,
) -> None:
    """Write the rule set as a Prometheus rule file (YAML, stdout) for alerts mode
    (detection.mode: alerts): groups with their interval, recording rules, expr, for,
    keep_firing_for, labels (severity, the rule's, healer_rule: <rule>) and annotations (plus
    healer's keys, healer_actions and the others, and healer_rule_digest). healer loads the file
    back as the same rules. vmalert reads the same file (before 1.94 with --no-keep-firing-for).
    Invalid rule files: every problem on stderr, exit 1, nothing written."""
    from ruamel.yaml import YAML
    from ruamel.yaml.scalarstring import LiteralScalarString

    from healer.ruleset.export import prometheus_rule_file, prometheus_rule_object

    v = _valid(ctx, paths, no_promql)
    assert v.ruleset is not None
    interval = settings_from(ctx).scheduler.default_interval_seconds
    if prometheus_rule:
        doc = prometheus_rule_object(
            v.ruleset,
            default_interval_seconds=interval,
            name=name,
            namespace=namespace,
            labels=_label_pairs(label or []),
            keep_firing_for=not no_keep_firing_for,
        )
        groups = doc["spec"]["groups"]
    else:
        doc = prometheus_rule_file(
            v.ruleset, default_interval_seconds=interval, keep_firing_for=not no_keep_firing_for
        )
        groups = doc["groups"]
    for group in groups:
        for rule in group["rules"]:  # recording rules included
            if "\n" in rule["expr"]:
                rule["expr"] = LiteralScalarString(rule["expr"] + "\n")
    yaml = YAML(typ="rt")
    yaml.width = 4096
    buf = io.StringIO()
    names = ", ".join(Path(f).name for f in v.files)
    buf.write(f"# Generated by `healer rules export` from {names}; re-export, do not edit.\n")
    yaml.dump(doc, buf)
    typer.echo(buf.getvalue(), nl=False)


@app.command("scrape-keep")
def scrape_keep(
    ctx: typer.Context,
    paths: Paths = None,
    also: Annotated[
        list[str] | None,
        typer.Option("--also", help="Keep this metric name too (repeat), e.g. one your dashboards read."),
    ] = None,
    no_promql: NoPromql = False,
) -> None:
    """Write the metric_relabel_configs (YAML, stdout) that keeps only the metrics the rules read:
    add it to the scrape jobs of dcgm-exporter and node_exporter so Prometheus or VictoriaMetrics
    stores no series healer never reads (the rest of a dcgm-exporter or node_exporter scrape).
    Format: https://prometheus.io/docs/prometheus/latest/configuration/configuration/#metric_relabel_configs
    Exit 1 when the rule files are invalid or a rule selects metrics by a pattern (nothing written)."""
    from ruamel.yaml import YAML

    from healer.ruleset.scrape_keep import UnlistedMetrics, kept_metrics, metric_relabel_configs

    v = _valid(ctx, paths, no_promql)
    assert v.ruleset is not None
    try:
        names = kept_metrics(v.ruleset, also or [])
    except UnlistedMetrics as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except ValueError as exc:
        typer.echo(f"error: --also: {exc}", err=True)
        raise typer.Exit(2) from exc
    yaml = YAML(typ="rt")
    yaml.width = 4096
    buf = io.StringIO()
    files = ", ".join(Path(f).name for f in v.files)
    buf.write(
        f"# Generated by `healer rules scrape-keep` from {files}; re-generate, do not edit.\n"
        f"# Keeps the {len(names)} metric names healer reads. Put it under each scrape job of\n"
        "# dcgm-exporter and node_exporter whose other series nothing reads: the rest is dropped\n"
        "# before it is stored.\n"
    )
    yaml.dump({"metric_relabel_configs": metric_relabel_configs(names)}, buf)
    typer.echo(buf.getvalue(), nl=False)
