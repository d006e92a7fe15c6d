"""The scrape-time keep-list of a rule set: store only the series the rules read.

A Prometheus (or VictoriaMetrics) scrape job may end with ``metric_relabel_configs``, relabelling
rules applied to every scraped sample before it is stored; ``action: keep`` with
``source_labels: [__name__]`` drops every sample whose metric name does not match ``regex``
(anchored at both ends). Defined by Prometheus's configuration reference,
https://prometheus.io/docs/prometheus/latest/configuration/configuration/#metric_relabel_configs
(``<relabel_config>``); VictoriaMetrics' ``-promscrape.config`` reads the same section.

:func:`kept_metrics` lists the names: every metric the rules select
(:func:`healer.ruleset.inputs.metric_names`, each alternative of ``{__name__=~"A|B"}`` included;
the recording rules' inputs too, and not the series they record),
which covers what healer itself reads besides the rules (the exporter check and rule coverage query
the rules' metrics; the dashboard charts the rules' expressions, and GPU temperature and tensor
activity, both read by the default pack), plus :data:`ALWAYS_KEPT`. A rule whose selector names no
metric that can be listed (``{__name__=~"DCGM_.*"}``) makes the list impossible:
:class:`UnlistedMetrics`. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from healer.ruleset.inputs import metric_names, unlisted_selectors
from healer.ruleset.schema import RuleSet

#: Kept whatever the rules read: ``up``, the scrape's own health, which the engine writes for every
#: target (the default pack's ``ExporterTargetDown`` reads it; named so a pack without it keeps it).
ALWAYS_KEPT = ("up",)

#: A Prometheus metric name (data model: ``[a-zA-Z_:][a-zA-Z0-9_:]*``): no regex syntax in it.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class UnlistedMetrics(ValueError):
    """Rules whose selectors name no listable metric: a keep-list would drop their input."""

    def __init__(self, rules: list[str]) -> None:
        super().__init__(
            "these rules select metrics by a pattern, not by name, so no keep-list can name them: "
            + ", ".join(rules)
        )
        self.rules = rules


def kept_metrics(ruleset: RuleSet, also: Iterable[str] = ()) -> list[str]:
    """The metric names to keep at scrape time for ``ruleset`` (sorted): what its rules read,
    :data:`ALWAYS_KEPT` and ``also`` (names something else reads, e.g. a dashboard).

    Raises :class:`UnlistedMetrics` when a rule selects by a pattern; ValueError for a name in
    ``also`` that is not a metric name.
    """
    exprs = {r.name: r.expr for r in ruleset.rules} | {r.record: r.expr for r in ruleset.records}
    unlisted = [name for name, expr in exprs.items() if unlisted_selectors(expr)]
    if unlisted:
        raise UnlistedMetrics(unlisted)
    extra = list(also)
    bad = [n for n in extra if not _METRIC_NAME.fullmatch(n)]
    if bad:
        raise ValueError(f"not metric names: {', '.join(bad)}")
    # A recorded series is Prometheus's own, never scraped: its name has no place in the list.
    read = metric_names(list(exprs.values())) - {r.record for r in ruleset.records}
    return sorted(read | set(ALWAYS_KEPT) | set(extra))


def metric_relabel_configs(names: Iterable[str]) -> list[dict[str, Any]]:
    """One ``metric_relabel_configs`` entry keeping exactly ``names`` (metric names, so the
    alternation needs no escaping) and dropping every other scraped series."""
    return [{"source_labels": ["__name__"], "regex": "|".join(sorted(set(names))), "action": "keep"}]
