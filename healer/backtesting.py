"""``healer backtest``'s driver: Prometheus history (``healer.sources.history``) through one replay
per rule set (``healer.engine.replay``), summed up as reports (``healer.engine.backtest``).

All rule sets see the same ticks: each chunk of history is queried once for the union of their
expressions (an expression shared by both sets is queried once), then fed to every replay. Nothing
is written anywhere: no cluster, no provider, no database.

The step: by default (``step_seconds`` None) the ticks come every rule's own evaluation interval,
as the controller evaluates them: its group's ``interval``, else ``default_interval``; the ticks
are the shortest such interval (:func:`healer.engine.schedule.tick_seconds`) and each group is
evaluated only when due (:func:`healer.engine.schedule.due_groups`), its rules frozen in between.
An explicit step evaluates every rule at every tick.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from healer.engine.backtest import QueryFailure, Report, summarize
from healer.engine.evaluation import QueryResult, needs_addresses, node_of
from healer.engine.replay import Replay, ReplaySettings
from healer.engine.schedule import due_groups, tick_seconds
from healer.errors import HealerError, SourceError
from healer.model.addresses import AddressBook, failed_book
from healer.ruleset.schema import DEFAULT_NODE_LABELS, RuleSet
from healer.sources.history import DEFAULT_CHUNK_SECONDS, history_ticks, tick_times
from healer.sources.prometheus_range import PrometheusRange

#: The nodes of the fleet at a time: every node exporting a GPU temperature (dcgm-exporter).
DEFAULT_FLEET_QUERY = "group by (Hostname, hostname, node, kubernetes_node, nodename) (DCGM_FI_DEV_GPU_TEMP)"
_FLEET = "\x00fleet"


#: Seconds between evaluations of a group without an ``interval``, when the caller gives none (the
#: scheduler's ``default_interval_seconds`` default).
DEFAULT_INTERVAL_SECONDS = 30.0


def tick_count(start: datetime, end: datetime, step_seconds: float) -> int:
    """How many ticks the window has (for a progress bar)."""
    return len(tick_times(start, end, step_seconds))


def default_step(rulesets: Sequence[RuleSet], default_interval: float = DEFAULT_INTERVAL_SECONDS) -> float:
    """The backtest's step when none is given: the shortest evaluation interval of any rule (its
    group's ``interval``, else ``default_interval``), seconds, as the controller ticks."""
    return min(tick_seconds(r.groups, default_interval) for r in rulesets) if rulesets else default_interval


def backtest(
    source: PrometheusRange,
    rulesets: Sequence[tuple[str, RuleSet]],
    *,
    start: datetime,
    end: datetime,
    step_seconds: float | None,
    settings: ReplaySettings,
    default_interval: float = DEFAULT_INTERVAL_SECONDS,
    fleet_query: str | None = DEFAULT_FLEET_QUERY,
    chunk_seconds: float = DEFAULT_CHUNK_SECONDS,
    progress: Callable[[int], None] | None = None,
    addresses: Callable[[], AddressBook] | None = None,
) -> list[Report]:
    """Replay ``[start, end]`` every ``step_seconds`` through each ``(label, ruleset)``; one report each.

    ``step_seconds`` None: every rule at its own evaluation interval (its group's, else
    ``default_interval``), ticking at the shortest (:func:`default_step`); see the module docstring.

    ``fleet_query`` returns one series per node of the fleet (its node label names it); None counts
    only the nodes the rules return. ``progress`` gets the ticks done after each chunk. A rule whose
    query Prometheus failed is frozen for those ticks and listed in the report's ``failures``.

    ``addresses`` reads the cluster's address book, as for ``healer evaluate``: called at most once,
    at the first tick where a series names no node by its labels; its failure (``HealerError``) is
    the reason given for those series. The book is the cluster's now, not at the time of the
    history. Series that still name no node are in each rule's ``unresolved``: never dropped
    silently.
    """
    queries: dict[str, str] = {}
    for i, (_, ruleset) in enumerate(rulesets):
        for rule in ruleset.rules:
            queries[f"{i}\x00{rule.name}"] = rule.expr
    if fleet_query:
        queries[_FLEET] = fleet_query
    replays = [Replay(ruleset, settings) for _, ruleset in rulesets]
    per_group = step_seconds is None
    step = default_step([r for _, r in rulesets], default_interval) if step_seconds is None else step_seconds
    # Per replay: group name -> when it was last evaluated (group intervals, default step only).
    last: list[dict[str, datetime]] = [{} for _ in rulesets]
    book: list[AddressBook] = []  # read once, when first needed
    # (set index, rule) -> ticks failed and the first error: the report must say what it did not see.
    failed: dict[tuple[int, str], int] = {}
    first_error: dict[tuple[int, str], str] = {}
    for at, results in history_ticks(
        source,
        queries,
        start=start,
        end=end,
        step_seconds=step,
        chunk_seconds=chunk_seconds,
        progress=progress,
    ):
        fleet_result = results.get(_FLEET)
        fleet = (
            [n for s in fleet_result.samples if (n := node_of(s.labels, DEFAULT_NODE_LABELS))]
            if isinstance(fleet_result, QueryResult)
            else []
        )
        for i, replay in enumerate(replays):
            prefix = f"{i}\x00"
            mine: dict[str, QueryResult | SourceError] = {
                key[len(prefix) :]: value for key, value in results.items() if key.startswith(prefix)
            }
            # Failures are counted at every tick (the report's "failed in N of M ticks"), due or not.
            for name, value in mine.items():
                if isinstance(value, SourceError):
                    failed[i, name] = failed.get((i, name), 0) + 1
                    first_error.setdefault((i, name), str(value))
            if per_group:
                mine = _due_only(replay.ruleset, mine, last[i], at, default_interval, step)
            if addresses is not None and not book and needs_addresses(replay.ruleset, mine):
                book.append(_read(addresses))
            replay.tick(at, mine, fleet=fleet, addresses=book[0] if book else None)
    return [
        replace(
            summarize(
                replay.result(),
                rules=[r.name for r in ruleset.rules],
                start=start,
                end=end,
                step_seconds=step,
                label=label,
            ),
            failures=[
                QueryFailure(rule=r.name, ticks=failed[i, r.name], error=first_error[i, r.name])
                for r in ruleset.rules
                if (i, r.name) in failed
            ],
        )
        for i, (replay, (label, ruleset)) in enumerate(zip(replays, rulesets, strict=True))
    ]


def _due_only(
    ruleset: RuleSet,
    results: dict[str, QueryResult | SourceError],
    last: dict[str, datetime],
    at: datetime,
    default_interval: float,
    step: float,
) -> dict[str, QueryResult | SourceError]:
    """The results of the rules whose group is due at ``at`` (``last`` updated); the others are
    left out, so the replay freezes them for the tick, as the controller does between a group's
    evaluations."""
    due = due_groups(ruleset.groups, last, at, default_interval=default_interval, tick_seconds=step)
    for name in due:
        last[name] = at
    wanted = {r.name for g in ruleset.groups if g.name in due for r in g.rules}
    return {name: value for name, value in results.items() if name in wanted}


def _read(addresses: Callable[[], AddressBook]) -> AddressBook:
    """The cluster's address book, or an empty one saying why it could not be read."""
    try:
        return addresses()
    except HealerError as exc:
        return failed_book(str(exc))
