"""A rule's input metrics: the metric names its PromQL expression selects.

They define the rule's node pool when the rule names none (``pool:``): the nodes that export at
least one series of them (a ``DCGM_FI_DEV_*`` rule counts over nodes running dcgm-exporter, an
InfiniBand rule over nodes exporting ``node_infiniband_*``). Parsed with GreptimeTeam's
``promql-parser`` (the Rust port of Prometheus' parser); pure.
"""

from __future__ import annotations

import re

import promql_parser

#: A regular expression that only lists names (``a|b|c``), as ``{__name__=~"..."}`` may.
_NAME_ALTERNATION = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*(?:\|[A-Za-z_:][A-Za-z0-9_:]*)*$")


def input_metrics(expr: str) -> frozenset[str]:
    """The metric names ``expr`` selects (``foo`` and ``{__name__="foo"}`` alike).

    A selector whose name is a regular expression other than a list of names (``=~"DCGM_.*"``)
    cannot be listed and is left out; an expression that does not parse selects nothing here
    (the rule file's check reports it). Returns an empty set when no name can be listed.
    """
    try:
        tree = promql_parser.parse(expr)
    except Exception:  # the parser raises its own error types; rule validation reports them
        return frozenset()
    names: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name != "__name__":
                    continue
                if matcher.op == promql_parser.MatchOp.Equal:
                    names.add(matcher.value)
                elif matcher.op == promql_parser.MatchOp.Re and _NAME_ALTERNATION.match(matcher.value):
                    names.update(matcher.value.split("|"))
        return True

    promql_parser.walk(tree, pre_visit=visit)
    return frozenset(names)


def family(metrics: frozenset[str]) -> str:
    """A short name for a set of metrics: their common prefix up to an ``_`` (``node_infiniband``
    for ``node_infiniband_port_state`` and ``node_infiniband_link_downed_total``), else the first."""
    if not metrics:
        return ""
    ordered = sorted(metrics)
    first, last = ordered[0], ordered[-1]
    common = first[
        : next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), len(first))
    ]
    head = common.rsplit("_", 1)[0] if "_" in common and common not in metrics else common
    return head.strip("_") or first
