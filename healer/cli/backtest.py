"""``healer backtest``: what the rules would have done over Prometheus's history.

Exit status: 0 the report was produced; 1 Prometheus failed for part of the window (the report is
still printed, then one error line per rule concerned: it was frozen for those ticks, as in the
controller), or for all of it (no report); 2 bad usage, settings or rules (PromQL is checked by
promtool when it is installed, as ``healer rules validate`` does), or a rule is degraded: some of
its series named no node (no node label, and their ``instance`` address is no Node's and no
exporter pod's), as ``healer evaluate --once`` exits 2. Those series are counted per rule in every
output (``unresolved``), never dropped silently; addresses are looked up in the cluster as
``healer evaluate`` does, only when such series exist.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from healer.cli.context import settings_from
from healer.cli.evaluate import DEGRADED, degraded_line
from healer.cli.tables import columns
from healer.config import Settings
from healer.errors import ConfigError

if TYPE_CHECKING:
    from healer.engine.backtest import Comparison, QueryFailure, Report


class Output(StrEnum):
    table = "table"
    json = "json"
    html = "html"


_RELATIVE = re.compile(r"^(?:now)?-(?P<d>.+)$")


def parse_time(text: str, now: datetime) -> datetime:
    """``2026-11-24T00:00:00Z``, ``2026-11-24`` (UTC), ``now``, or ``-7d`` / ``now-6h`` (before ``now``)."""
    from healer.ruleset.durations import parse_duration

    text = text.strip()
    if text == "now":
        return now
    rel = _RELATIVE.match(text)
    if rel:
        return now - timedelta(seconds=parse_duration(rel.group("d")))
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _option_time(option: str, text: str, now: datetime) -> datetime:
    """:func:`parse_time`, or exit 2 naming ``option`` and the forms it takes."""
    try:
        return parse_time(text, now)
    except ValueError as exc:
        typer.echo(
            f"error: {option} {text!r} is not a time: use ISO 8601 (2026-11-24T00:00:00Z, 2026-11-24), "
            "now, or a duration before now (-7d, now-6h, -90m)",
            err=True,
        )
        raise typer.Exit(2) from exc


def _table(report: Report) -> str:
    from healer.ruleset.durations import format_duration

    rows = [["RULE", "FIRED", "NODES FIRED", "NODES OUT", "NODE-HOURS", "HELD BUDGET", "HELD BREAKER"]]
    for r in report.rules:
        rows.append(
            [
                r.rule,
                str(r.fired),
                str(r.nodes_fired),
                str(r.nodes_out),
                f"{r.node_hours:.2f}",
                str(r.held_budget),
                str(r.held_breaker),
            ]
        )
    out = [
        f"{report.label}: {report.start.isoformat()} to {report.end.isoformat()}, {report.ticks} ticks "
        f"every {format_duration(report.step_seconds)}",
        columns(rows),
    ]
    node_rows = [["NODE", "RULE", "FIRED", "QUARANTINED", "DRAINED", "TICKETED", "HELD", "HOURS OUT"]]
    for n in report.nodes:

        def first(times: list[datetime]) -> str:
            return (
                times[0].strftime("%Y-%m-%d %H:%M:%S") + (f" (+{len(times) - 1})" if len(times) > 1 else "")
                if times
                else "-"
            )

        held = "budget" if n.held_budget else "breaker" if n.held_breaker else "-"
        node_rows.append(
            [
                n.node,
                n.rule,
                first(n.fired),
                first(n.quarantined),
                first(n.drained),
                first(n.ticketed),
                held,
                f"{n.hours_out:.2f}",
            ]
        )
    if len(node_rows) > 1:
        out += ["", columns(node_rows)]
    for at, why in report.breaker_trips:
        out.append(f"circuit breaker tripped at {at.isoformat()}: {why}")
    for at, what in report.domain_incidents:
        out.append(f"domain incident at {at.isoformat()}: {what}")
    if report.degraded:
        out += ["", DEGRADED]
        for u in report.degraded:
            how_many = f"up to {u.series} series in {u.ticks} of {report.ticks} ticks"
            out.append(degraded_line(u.rule, how_many, u.first.example_instance))
            out.append(f"    first tick: {u.first}")
    return "\n".join(out)


def _comparison_table(c: Comparison) -> str:
    rows = [
        [
            "RULE",
            f"NODES OUT {c.a.label}",
            f"NODES OUT {c.b.label}",
            f"NODE-HOURS {c.a.label}",
            f"NODE-HOURS {c.b.label}",
            f"ONLY {c.a.label}",
            f"ONLY {c.b.label}",
        ]
    ]
    for d in c.rules:
        rows.append(
            [
                d.rule,
                str(d.a.nodes_out) if d.a else "-",
                str(d.b.nodes_out) if d.b else "-",
                f"{d.a.node_hours:.2f}" if d.a else "-",
                f"{d.b.node_hours:.2f}" if d.b else "-",
                ", ".join(d.only_a) or "-",
                ", ".join(d.only_b) or "-",
            ]
        )
    return columns(rows)


def backtest(
    ctx: typer.Context,
    start: Annotated[
        str, typer.Option("--from", help="Window start: ISO time (UTC), or -7d / now-6h.")
    ] = "-7d",
    end: Annotated[str, typer.Option("--to", help="Window end: ISO time (UTC), now, or -1h.")] = "now",
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            help="Seconds between ticks (Prometheus duration), every rule at every tick (default: each "
            "rule at its own evaluation interval: its group's interval, else "
            "scheduler.default_interval_seconds).",
        ),
    ] = None,
    rules: Annotated[
        list[Path] | None,
        typer.Option(
            "--rules", help="Rule files or directories (default: the rules_paths setting). Repeatable."
        ),
    ] = None,
    compare: Annotated[
        list[Path] | None,
        typer.Option(
            "--compare", help="A second rule set (files or directories) to compare with. Repeatable."
        ),
    ] = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="table, json or html.")] = Output.table,
    fleet_size: Annotated[
        int | None,
        typer.Option("--fleet-size", help="Nodes in the fleet (default: nodes exporting GPU metrics)."),
    ] = None,
    repair_after: Annotated[
        str | None,
        typer.Option(
            "--repair-after", help="Assume a ticket is resolved this long after it is sent (default: never)."
        ),
    ] = None,
    chunk: Annotated[str, typer.Option("--chunk", help="History per range query.")] = "2h",
    topology: Annotated[
        Path | None,
        typer.Option(
            "--topology",
            help="A topology file (docs/topology.md): replay domain correlation with the topology "
            "settings' thresholds (default: topology.file; none: no correlation).",
        ),
    ] = None,
) -> None:
    """Replay Prometheus history through the rules, lifecycle and safety (nothing is changed, no
    ticket sent): per rule and node when it would have fired, quarantined, drained, been held by the
    budget or the breaker; per rule nodes taken out and node-hours lost; --compare a second rule set."""
    from healer import wiring
    from healer.backtesting import backtest as run_backtest
    from healer.backtesting import default_step, tick_count
    from healer.engine.backtest import compare as compare_reports
    from healer.engine.backtest import comparison_dict, report_dict
    from healer.engine.replay import ReplaySettings
    from healer.errors import RuleError, SourceError
    from healer.ruleset.durations import parse_duration
    from healer.ruleset.loading import load_ruleset
    from healer.sources.prometheus_range import PrometheusRange

    settings = settings_from(ctx)
    now = wiring.utc_now()
    # Whole seconds: the ticks are matched to Prometheus's step timestamps.
    t0 = _option_time("--from", start, now).replace(microsecond=0)
    t1 = _option_time("--to", end, now).replace(microsecond=0)
    try:
        given_step = parse_duration(step) if step is not None else None
        chunk_s = parse_duration(chunk)
        repair_s = parse_duration(repair_after) if repair_after else None
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if t1 <= t0 or given_step == 0:
        typer.echo("error: --to must be after --from, and --step positive", err=True)
        raise typer.Exit(2)
    sets = [("current", rules or list(settings.rules_paths))]
    if compare:
        sets.append(("proposed", compare))
    try:
        device_filter = settings.infiniband.device_filter()
        rulesets = [(label, load_ruleset(paths, device_filter=device_filter)) for label, paths in sets]
    except RuleError as exc:
        typer.echo(f"error: the rules do not load\n{exc}", err=True)
        raise typer.Exit(2) from exc
    topology_path = topology or settings.topology.file
    try:
        replay_topology = _replay_topology(settings, topology_path)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    default_interval = settings.scheduler.default_interval_seconds
    step_s = given_step or default_step([r for _, r in rulesets], default_interval)
    p = settings.prometheus
    source = PrometheusRange(
        p.url, timeout_seconds=max(p.timeout_seconds, 60.0), headers=p.headers, verify_tls=p.verify_tls
    )
    total = tick_count(t0, t1, step_s)
    with typer.progressbar(length=total, label="backtest", file=sys.stderr) as bar:
        done = [0]

        def progress(n: int) -> None:
            bar.update(n - done[0])
            done[0] = n

        try:
            reports = run_backtest(
                source,
                rulesets,
                start=t0,
                end=t1,
                step_seconds=given_step,
                default_interval=default_interval,
                settings=ReplaySettings(
                    limits=settings.safety.limits(),
                    recovery_hold_seconds=settings.safety.recovery_hold_seconds,
                    fleet_size=fleet_size,
                    repair_after_seconds=repair_s,
                    **replay_topology,
                ),
                chunk_seconds=chunk_s,
                progress=progress,
                addresses=wiring.address_lookup(settings),
            )
        except SourceError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc
    failures = [(r.label, f) for r in reports for f in r.failures]
    if (
        failures
        and all(f.ticks == r.ticks for r in reports for f in r.failures)
        and all(len(r.failures) == len(r.rules) for r in reports)
    ):
        typer.echo(f"error: no query of any rule succeeded, no report: {failures[0][1].error}", err=True)
        raise typer.Exit(1)
    comparison = compare_reports(reports[0], reports[1]) if len(reports) == 2 else None
    if output is Output.json:
        body = comparison_dict(comparison) if comparison else report_dict(reports[0])
        typer.echo(json.dumps(body, indent=2))
    elif output is Output.html:
        from healer.reports.backtest_html import render

        typer.echo(render(reports[0], comparison))
    else:
        for report in reports:
            typer.echo(_table(report) + "\n")
        if comparison:
            typer.echo(_comparison_table(comparison))
    if failures:
        _echo_failures(failures, len(reports) > 1)
        raise typer.Exit(1)
    if any(r.degraded for r in reports):
        raise typer.Exit(2)


def _replay_topology(settings: Settings, path: Path | None) -> dict[str, Any]:
    """The replay's topology, thresholds and kind order from the topology file ``path`` (none: no
    correlation). Raises ConfigError naming the file and field."""
    from healer.topology import build, load_file, thresholds

    kinds = settings.topology.kinds()
    if path is None or not kinds:
        return {}
    file_map = load_file(path, frozenset(kinds))
    return {
        "topology": build({node: {} for node in file_map}, settings.topology, file_map=file_map),
        "thresholds": thresholds(settings.topology),
        "kind_order": tuple(kinds),
    }


def _echo_failures(failures: list[tuple[str, QueryFailure]], labelled: bool) -> None:
    """One stderr line per rule whose query failed: the rule, how many ticks, Prometheus's error."""
    for label, f in failures:
        where = f" ({label})" if labelled else ""
        typer.echo(
            f"error: rule {f.rule}{where}: Prometheus failed for {f.ticks} tick(s), the rule was frozen "
            f"then and the report undercounts it: {f.error}",
            err=True,
        )
