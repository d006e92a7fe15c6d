"""``healer evaluate --once``: one detection tick against the configured Prometheus, printed.

Exit status: 0 every rule evaluated; 1 the source was unavailable for at least one rule (timeout,
5xx, transport error, deadline); 2 bad settings, rules or database, or a rule is degraded (some of
its series name no node: no node label naming a Node or an exporter pod, and their ``instance``
address is no Node's and no exporter pod's); 3 a rule is broken (the source refused its PromQL).

Which node a series names is checked in the cluster (Node names, exporter pod names and IPs, Node
InternalIPs; :mod:`healer.model.addresses` has the order), with the configured kubeconfig or
in-cluster account, and only when some rule returns series. Without a readable cluster a node
label's value is taken as it is.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from healer.cli.context import require_rule_paths, settings_from
from healer.cli.output import FormatAlias, Output, OutputOption, chosen, emit
from healer.cli.tables import columns

if TYPE_CHECKING:
    from healer.detection import DetectionResult
    from healer.model.findings import Finding


def evaluate(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option("--once", help="Run one tick and exit (required).")] = False,
    output: OutputOption = Output.TABLE,
    format_alias: FormatAlias = None,
    store: Annotated[
        bool,
        typer.Option(
            "--store/--no-store",
            help="Resume from and record into the configured database (default), or touch nothing.",
        ),
    ] = True,
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", help="Prometheus base URL (default: the prometheus.url setting)."),
    ] = None,
) -> None:
    """Query every rule once at the current time and print the findings and each rule's health."""
    from healer import wiring
    from healer.detection import initial_state, run_detection
    from healer.errors import RuleError, StoreError
    from healer.model.states import RuleHealth
    from healer.redaction import redact_url
    from healer.ruleset.loading import load_ruleset

    if not once:
        typer.echo("error: give --once (`healer run` runs the controller loop)", err=True)
        raise typer.Exit(2)
    settings = settings_from(ctx)
    if prometheus:
        settings = settings.model_copy(
            update={"prometheus": settings.prometheus.model_copy(update={"url": prometheus})}
        )
    require_rule_paths(settings.rules_paths, given=False)
    try:
        ruleset = load_ruleset(
            settings.rules_paths,
            recording_rules=settings.detection.recording_rules,
            device_filter=settings.infiniband.device_filter(),
        )
    except RuleError as exc:
        typer.echo(f"error: the rules do not load\n{exc}", err=True)
        raise typer.Exit(2) from exc
    factory = None
    if store:
        try:
            factory = wiring.sessions(settings)
        except StoreError as exc:
            typer.echo(f"error: {exc}, or pass --no-store", err=True)
            raise typer.Exit(2) from exc
    with wiring.prometheus_source(settings) as source:
        result = run_detection(
            ruleset=ruleset,
            source=source,
            session_factory=factory,
            state=initial_state(factory),
            now=wiring.utc_now(),
            concurrency=settings.prometheus.max_concurrent_queries,
            addresses=wiring.address_lookup(settings),
        )
    if not emit(as_json(result), chosen(output, format_alias=format_alias)):
        typer.echo(as_table(result))
    healths = {r.health for r in result.reports}
    if RuleHealth.UNAVAILABLE in healths:
        typer.echo(
            f"healer asked {redact_url(settings.prometheus.url)}; point it at your Prometheus with "
            "--prometheus URL, or HEALER_PROMETHEUS__URL (prometheus.url in a --config file)",
            err=True,
        )
        raise typer.Exit(1)
    if RuleHealth.ERROR in healths:
        raise typer.Exit(3)
    if RuleHealth.DEGRADED in healths:
        raise typer.Exit(2)


def _findings(result: DetectionResult) -> list[Finding]:
    found = [f for fs in result.findings.firing.values() for f in fs]
    found += [f for fs in result.findings.pending.values() for f in fs]
    return sorted(found, key=lambda f: (f.node, f.gpu or "", f.rule, f.series_key))


def _value(f: Finding) -> str:
    from healer.model.findings import json_safe_value

    if f.value is None:
        return "-"
    text = f"{f.value:g}" if math.isfinite(f.value) else str(json_safe_value(f.value))
    return f"{text} {f.unit}" if f.unit else text


def _since(f: Finding, now: datetime) -> str:
    from healer.ruleset.durations import format_duration

    if f.active_since is None or f.active_since >= now:
        return "-"  # first seen at this tick: when it began is not known (see _SINCE_UNKNOWN)
    ago = max(0, int((now - f.active_since).total_seconds()))
    return f"{f.active_since:%Y-%m-%d %H:%M:%S}Z ({format_duration(ago)} ago)"


#: The footnote of a SINCE column showing ``-``.
_SINCE_UNKNOWN = (
    "SINCE -: first seen at this tick; with no earlier tick recorded (--no-store, or a new "
    "condition) when it began is not known"
)


def _shared_errors(result: DetectionResult) -> list[str]:
    """Errors that several unavailable rules share (the source's, e.g. connection refused)."""
    from healer.model.states import RuleHealth

    counts = Counter(r.error for r in result.reports if r.health == RuleHealth.UNAVAILABLE and r.error)
    return [error for error, n in counts.items() if n > 1]


def as_table(result: DetectionResult) -> str:
    """The findings table (node, GPU, rule, state, value and unit, since), unknown nodes, and the
    per-rule health table. An error several rules share (the source's) is printed once above the
    rule table, its rows saying ``unavailable``; SINCE is ``-`` (with a footnote) for findings
    first seen at this tick."""
    now = result.findings.at
    out: list[str] = [f"evaluated at {now:%Y-%m-%d %H:%M:%S}Z"]
    findings = _findings(result)
    if findings:
        rows = [["NODE", "GPU", "RULE", "STATE", "VALUE", "SINCE"]]
        rows += [[f.node, f.gpu or "-", f.rule, str(f.state), _value(f), _since(f, now)] for f in findings]
        out += ["", columns(rows)]
        if any(row[-1] == "-" for row in rows[1:]):
            out.append(_SINCE_UNKNOWN)
    elif result.source_unavailable:
        out += ["", "no findings known: the metrics source could not be queried (see below)"]
    else:
        out += ["", "no findings"]
    if result.findings.unknown:
        out += [
            "",
            "no data (unknown, neither healthy nor faulty): " + ", ".join(sorted(result.findings.unknown)),
        ]
    shared = _shared_errors(result)
    out += [""] + [f"metrics source unavailable: {error}" for error in shared] + ([""] if shared else [])
    rows = [["RULE", "GROUP", "HEALTH", "SERIES", "PENDING", "FIRING", "SECONDS", "ERROR / WARNINGS"]]
    for r in result.reports:
        notes = ["unavailable" if r.error in shared else r.error] if r.error else []
        notes += r.warnings
        if r.unresolved is not None:
            notes.append(str(r.unresolved))
        rows.append(
            [
                r.rule,
                r.group,
                str(r.health),
                str(r.series),
                str(r.pending),
                str(r.firing),
                f"{r.duration_seconds:.3f}",
                "; ".join(notes),
            ]
        )
    out += [columns(rows), "", f"{result.queries} queries in {result.duration_seconds:.3f}s"]
    degraded = [r for r in result.reports if r.unresolved is not None]
    if degraded:
        out += ["", DEGRADED]
        out += [
            degraded_line(r.rule, f"{r.unresolved.count} series", r.unresolved.example_instance)
            for r in degraded
            if r.unresolved is not None
        ]
    return "\n".join(out)


#: Above the rules some of whose series name no node (``healer evaluate`` and ``healer backtest``).
DEGRADED = (
    "degraded: series that name no node act on nothing; give them a node label naming their Node "
    "or exporter pod, or an address:"
)


def degraded_line(rule: str, how_many: str, instance: str | None) -> str:
    """One rule under :data:`DEGRADED`: how many series, and the scrape address of one of them."""
    return f"  {rule}: {how_many}, e.g. instance={instance or '-'}"


def as_json(result: DetectionResult) -> dict[str, Any]:
    """``{"at", "findings": [...], "unknown": [...], "frozen_rules": [...], "rules": [...],
    "queries", "duration_seconds"}``; values NaN/±Inf as the strings Prometheus uses."""
    from healer.model.findings import json_safe_value

    def iso(t: datetime | None) -> str | None:
        return t.isoformat() if t else None

    return {
        "at": iso(result.findings.at),
        "findings": [
            {
                "node": f.node,
                "gpu": f.gpu,
                "rule": f.rule,
                "state": str(f.state),
                "severity": f.severity,
                "value": json_safe_value(f.value),
                "unit": f.unit,
                "since": iso(f.active_since),
                "fired_at": iso(f.fired_at),
                "summary": f.summary,
                "labels": dict(f.labels),
            }
            for f in _findings(result)
        ],
        "unknown": sorted(result.findings.unknown),
        "frozen_rules": sorted(result.findings.frozen_rules),
        "rules": [
            {
                "rule": r.rule,
                "group": r.group,
                "kind": r.kind,
                "health": str(r.health),
                "error": r.error,
                "series": r.series,
                "pending": r.pending,
                "firing": r.firing,
                "duration_seconds": r.duration_seconds,
                "warnings": r.warnings,
                "by_address": r.by_address,
                "unresolved": (
                    {
                        "count": r.unresolved.count,
                        "example": r.unresolved.example,
                        "example_instance": r.unresolved.example_instance,
                        "why": r.unresolved.why,
                    }
                    if r.unresolved
                    else None
                ),
            }
            for r in result.reports
        ],
        "queries": result.queries,
        "duration_seconds": result.duration_seconds,
    }
