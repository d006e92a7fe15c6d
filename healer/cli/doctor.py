"""``healer doctor exporters``: which metrics the loaded rules read that no target exports.

Reads the live Prometheus (one instant query: which of the rules' metric names have a series now)
and prints, per rule, each input absent fleet-wide: ``required`` (the rule finds nothing until it
appears), ``fallback`` (absent, and the rule does without), or ``until first event`` (an Xid series
that exporters emit only after a GPU's first Xid). For dcgm-exporter fields it names the counters
CSV line that adds the field (``deploy/dcgm-exporter/counters-<line>.csv``, one per exporter line).

Exit status: 0 every rule can see its inputs; 1 Prometheus could not be queried or the rules do not
load; 2 bad usage or settings; 3 a rule reads a required metric no target exports.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from healer.cli.context import require_rule_paths, settings_from
from healer.cli.output import Output, OutputOption, emit, table_width
from healer.cli.tables import columns

if TYPE_CHECKING:
    from healer.ruleset.counters import CounterLine
    from healer.ruleset.inputs import Input, RuleInputs

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Check what healer's rules depend on.")

#: Where the repository keeps healer's counters CSVs (relative to the working directory).
DEFAULT_COUNTERS = Path("deploy/dcgm-exporter")


def _where(i: Input, counters: dict[str, list[CounterLine]]) -> list[str]:
    """What would add input ``i``: the counters CSV lines naming one of its names, or a hint."""
    lines = [str(line) for name in i.names for line in counters.get(name, [])]
    if lines:
        return lines
    if all(n.startswith("node_") for n in i.names):
        return ["node_exporter (its collector for this family must be on)"]
    if all(n.startswith("DCGM_") for n in i.names):
        return ["no counters CSV line names it (is --counters the deploy/dcgm-exporter directory?)"]
    return ["-"]


def _rows(checks: list[RuleInputs]) -> list[tuple[str, str, Input]]:
    rows = []
    for c in checks:
        rows += [(c.rule, "required", i) for i in c.required]
        rows += [(c.rule, "until first event", i) for i in c.events]
        rows += [(c.rule, "fallback", i) for i in c.optional]
    return rows


@app.command()
def exporters(
    ctx: typer.Context,
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", help="Prometheus base URL (default: the prometheus.url setting)."),
    ] = None,
    counters: Annotated[
        Path,
        typer.Option("--counters", help="Directory of the counters-<line>.csv files.", file_okay=False),
    ] = DEFAULT_COUNTERS,
    output: OutputOption = Output.TABLE,
) -> None:
    """Rules whose input metrics no target exports, with the counters CSV line that adds them."""
    from healer import wiring
    from healer.errors import RuleError, SourceError
    from healer.redaction import redact_url
    from healer.ruleset.counters import read_counters
    from healer.ruleset.inputs import check_rule, presence_query
    from healer.ruleset.loading import load_ruleset

    settings = settings_from(ctx)
    if prometheus:
        settings = settings.model_copy(
            update={"prometheus": settings.prometheus.model_copy(update={"url": prometheus})}
        )
    require_rule_paths(settings.rules_paths, given=False)
    try:
        ruleset = load_ruleset(settings.rules_paths, recording_rules=settings.detection.recording_rules)
    except RuleError as exc:
        typer.echo(f"error: the rules do not load\n{exc}", err=True)
        raise typer.Exit(1) from exc
    try:
        with wiring.prometheus_source(settings) as source:
            answer = source.query(presence_query([r.expr for r in ruleset.rules]), at=wiring.utc_now())
    except SourceError as exc:
        typer.echo(f"error: Prometheus could not be queried: {exc}", err=True)
        typer.echo(
            f"healer asked {redact_url(settings.prometheus.url)}; point it at your Prometheus with "
            "--prometheus URL, or HEALER_PROMETHEUS__URL (prometheus.url in a --config file)",
            err=True,
        )
        raise typer.Exit(1) from exc
    present = {s.labels.get("__name__", "") for s in answer.samples}
    checks = [check_rule(r.name, r.expr, present) for r in ruleset.rules]
    lines = read_counters(counters) if counters.is_dir() else {}
    rows = _rows(checks)
    blind = [c.rule for c in checks if c.blind]
    document: dict[str, Any] = {
        "prometheus": redact_url(source.url),
        "rules": len(checks),
        "blind_rules": blind,
        "absent": [
            {"rule": rule, "metric": list(i.names), "needed": needed, "added_by": _where(i, lines)}
            for rule, needed, i in rows
        ],
    }
    if not emit(document, output):
        if rows:
            table = [["RULE", "METRIC (ABSENT FLEET-WIDE)", "NEEDED", "ADDED BY"]]
            for rule, needed, i in rows:
                where = _where(i, lines)
                table.append([rule, str(i), needed, where[0]])
                table += [["", "", "", more] for more in where[1:]]
            typer.echo(columns(table, width=table_width(output)))
            typer.echo("")
        if blind:
            typer.echo(
                f"{len(blind)} of {len(checks)} rules read a metric no target exports and find nothing: "
                + ", ".join(blind)
            )
        else:
            typer.echo(f"every one of the {len(checks)} rules can see its inputs")
    if blind:
        raise typer.Exit(3)
