"""Observing rule coverage: which nodes export each rule's input metrics (the rules' node pools).

For every chain of node labels the rules use, one instant query::

    group by (__name__, Hostname, ..., instance) ({__name__=~"DCGM_FI_DEV_GPU_TEMP|node_infiniband_..."})

answers, per metric, the nodes with at least one series of it (Prometheus' lookback, 5 minutes by
default, decides how long a silent exporter still counts). A rule's coverage is the union over its
input metrics (:func:`healer.ruleset.inputs.input_metrics`). The result is data for the pure
:func:`healer.engine.pools.build`; the controller refreshes it every
``safety.coverage_refresh_seconds`` and keeps the last good answer when a query fails.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from datetime import datetime

from healer.engine.evaluation import node_of
from healer.engine.labels import clean_node_name
from healer.engine.pools import removing_rules
from healer.errors import SourceError
from healer.model.addresses import AddressBook
from healer.ruleset.inputs import input_metrics
from healer.ruleset.schema import RuleSet
from healer.sources.base import Deadline, MetricsSource

log = logging.getLogger(__name__)


def coverage_query(metrics: Iterable[str], node_labels: Iterable[str]) -> str:
    """The PromQL that lists (metric, node labels, ``instance``) for ``metrics`` (``instance``
    names the node of a series without node labels, as node_exporter's)."""
    names = "|".join(re.escape(m) for m in sorted(metrics))
    by = ", ".join(["__name__", *node_labels, "instance"])
    return f'group by ({by}) ({{__name__=~"{names}"}})'


def observe_coverage(
    *,
    ruleset: RuleSet,
    source: MetricsSource,
    now: datetime,
    deadline: Deadline | None = None,
    book: AddressBook | None = None,
) -> dict[str, frozenset[str]]:
    """rule → the nodes exporting at least one of its input metrics, at ``now``.

    Each series' node is resolved as a rule's series is (``book``:
    :meth:`~healer.model.addresses.AddressBook.resolve`, checked against the cluster's Nodes and
    exporter pods, else the ``instance`` address); a series naming no Node counts for none.
    Without a book the first node label is taken as it is.

    Only rules that take nodes out of service and name no pool are observed. A rule whose metrics
    cannot be listed, whose query failed (logged), or whose metrics no node exports (no data is
    not a pool of none) is left out: it counts over the labelled pools until an observation
    succeeds.
    """
    named = ruleset.pools()
    wanted = {
        name: (rule.node_labels, input_metrics(rule.expr))
        for name in removing_rules(ruleset)
        if name not in named and (rule := ruleset.rule(name))
    }
    chains: dict[tuple[str, ...], set[str]] = {}
    for chain, metrics in wanted.values():
        if metrics:
            chains.setdefault(chain, set()).update(metrics)
    seen: dict[tuple[tuple[str, ...], str], set[str]] = {}  # (chain, metric) → nodes
    failed: set[tuple[str, ...]] = set()
    for chain, chain_metrics in chains.items():
        try:
            answer = source.query(coverage_query(chain_metrics, chain), at=now, deadline=deadline)
        except SourceError as exc:
            log.warning("rule coverage not observed (labelled pools stand in): %s", exc)
            failed.add(chain)
            continue
        for sample in answer.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "__name__"}
            node = node_of(labels, chain) if book is None else book.resolve(labels, chain).node
            metric = sample.labels.get("__name__", "")
            if node:
                seen.setdefault((chain, metric), set()).add(clean_node_name(node))
    out: dict[str, frozenset[str]] = {}
    for name, (chain, metrics) in wanted.items():
        covered = (
            frozenset().union(*(seen.get((chain, m), set()) for m in metrics)) if metrics else frozenset()
        )
        if covered and chain not in failed:
            out[name] = covered
    return out
