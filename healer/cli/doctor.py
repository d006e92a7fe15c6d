"""``healer doctor exporters``: which metrics the loaded rules read that no target exports, and
where on each node a rule cannot see.

Reads the live Prometheus (one instant query: which of the rules' metric names have a series now)
and prints, per rule, each input absent fleet-wide: ``required`` (the rule finds nothing until it
appears), ``fallback`` (absent, and the rule does without), ``until first event`` (an Xid series
that exporters emit only after a GPU's first Xid), or the hardware that alone reports it (``NVLink5
(Blackwell) GPUs only``: absent on a fleet without such GPUs, missing from the CSV on one with
them). For dcgm-exporter fields it names the counters
CSV line that adds the field (``deploy/dcgm-exporter/counters-<line>.csv``, one per exporter line).

Then, per node, its blind spots (:mod:`healer.blind_spots`): a GPU or InfiniBand port lacking an
input a rule reads while other targets export it (``--node NAME`` for one node's, all of its
rules). Series name their node as the rules' do, checked against the cluster when a Kubernetes
configuration is at hand (else node labels are taken as they are, said in one line).

Exit status: 0 every rule can see its inputs everywhere; 1 Prometheus could not be queried, the
rules do not load, or ``--node`` names no Node of the cluster; 2 bad usage or settings; 3 a rule
reads a required metric no target exports, or a node has a blind spot.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from healer.cli.context import require_rule_paths, settings_from
from healer.cli.output import Output, OutputOption, emit, table_width
from healer.cli.tables import columns

if TYPE_CHECKING:
    from healer.config import Settings
    from healer.model.addresses import AddressBook
    from healer.model.blind_spots import BlindReport, BlindSpot
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
    if all(n.startswith("healer_agent_") for n in i.names):
        return ["the node agent's /metrics (chart agent.enabled, agent.metricsPort; scraped by a PodMonitor)"]
    if all(n.startswith("DCGM_") for n in i.names):
        return ["no counters CSV line names it (is --counters the deploy/dcgm-exporter directory?)"]
    return ["-"]


def _hardware(i: Input) -> str:
    """The "needed" column of a metric only some hardware reports: which hardware."""
    from healer.ruleset.inputs import HARDWARE_METRICS

    return HARDWARE_METRICS.get(i.names[0], "some hardware only")


def _rows(checks: list[RuleInputs]) -> list[tuple[str, str, Input]]:
    rows = []
    for c in checks:
        rows += [(c.rule, "required", i) for i in c.required]
        rows += [(c.rule, "until first event", i) for i in c.events]
        rows += [(c.rule, _hardware(i), i) for i in c.hardware]
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
    node: Annotated[
        str | None,
        typer.Option("--node", help="Show this node's blind spots only (its Kubernetes name)."),
    ] = None,
    output: OutputOption = Output.TABLE,
) -> None:
    """Rules whose input metrics no target exports (with the counters CSV line that adds them),
    and each node's blind spots: GPUs or InfiniBand ports lacking an input other targets export."""
    from healer import wiring
    from healer.blind_spots import observe_blind_spots
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
        ruleset = load_ruleset(
            settings.rules_paths,
            recording_rules=settings.detection.recording_rules,
            device_filter=settings.infiniband.device_filter(),
        )
    except RuleError as exc:
        typer.echo(f"error: the rules do not load\n{exc}", err=True)
        raise typer.Exit(1) from exc
    book, book_note = _address_book(settings)
    try:
        with wiring.prometheus_source(settings) as source:
            now = wiring.utc_now()
            answer = source.query(presence_query([r.expr for r in ruleset.rules]), at=now)
            report = observe_blind_spots(ruleset=ruleset, source=source, now=now, book=book)
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
    if (
        node is not None
        and book is not None
        and book.checks_labels
        and node.lower() not in (book.node_names or ())
    ):
        typer.echo(
            f"error: no Node named {node!r} in the cluster (--node takes a Kubernetes node name)", err=True
        )
        raise typer.Exit(1)
    spots = [s for s in report.spots if node is None or s.node == node]
    document: dict[str, Any] = {
        "prometheus": redact_url(source.url),
        "rules": len(checks),
        "blind_rules": blind,
        "absent": [
            {"rule": rule, "metric": list(i.names), "needed": needed, "added_by": _where(i, lines)}
            for rule, needed, i in rows
        ],
        "blind_spots": [s.as_dict() for s in spots],
        "unresolved_series": [{"series": u.series, "why": u.why} for u in report.unresolved],
        "errors": list(report.errors),
        "nodes_checked_against_cluster": book is not None,
    }
    if node is not None:
        document = {"node": node, **document}
    if not emit(document, output):
        if node is None:
            _print_fleet(rows, blind, checks, lines, output)
            typer.echo("")
        _print_spots(spots, node, report, book_note, output)
        if node is not None and blind:
            typer.echo(
                f"and fleet-wide, on every node: {len(blind)} rule(s) read a metric no target exports "
                f"({', '.join(blind)}); `healer doctor exporters` without --node lists them"
            )
    if blind or spots:
        raise typer.Exit(3)


def _address_book(settings: Settings) -> tuple[AddressBook | None, str]:
    """The cluster's address book (checks each series' node), or None and why not."""
    from healer import wiring
    from healer.errors import HealerError

    try:
        return wiring.address_lookup(settings)(), ""
    except HealerError as exc:
        return None, f"node names not checked against the cluster ({exc}): taken from the series' labels"


def _print_spots(
    spots: list[BlindSpot], node: str | None, report: BlindReport, note: str, output: Output
) -> None:
    if spots:
        table = [["NODE", "RULE", "WHERE", "LACKS (OTHER TARGETS EXPORT IT)"]]
        table += [[s.node, s.rule, s.scope, ", ".join(s.missing)] for s in spots]
        typer.echo(columns(table, width=table_width(output)))
        nodes = len({s.node for s in spots})
        typer.echo(f"{len(spots)} blind spot(s) on {nodes} node(s): no finding there means nothing")
    elif node is not None:
        typer.echo(f"no blind spot on {node}: every rule sees every GPU and port it lists")
    else:
        typer.echo("no blind spot: every node exports what its peers do")
    for u in report.unresolved:
        typer.echo(f"unresolved series (counted for no node): {u.series}: {u.why}")
    for e in report.errors:
        typer.echo(f"not observed: {e}", err=True)
    if note:
        typer.echo(note, err=True)


def _print_fleet(
    rows: list[tuple[str, str, Input]],
    blind: list[str],
    checks: list[RuleInputs],
    lines: dict[str, list[CounterLine]],
    output: Output,
) -> None:
    """The fleet-wide table: each rule's inputs no target exports."""
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
