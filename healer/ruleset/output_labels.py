"""Which labels a rule's expression certainly drops: a rule whose result keeps no node label
(none of its ``node_labels``, nor ``instance``) can name no node, so every series it returns is
a finding about no node and the rule is "degraded" at run time. ``healer rules validate`` warns
about it up front (:func:`node_blind`).

The analysis is sound, not complete: it says a label is absent only when the expression's
outermost label-changing step removes it for sure: an aggregation ``by (...)`` that does not
list it, one without ``by``/``without`` (``sum(x)``: no labels at all), or ``without (...)``
listing it. Comparisons and arithmetic with a number keep the vector side's labels; ``and`` and
``unless`` keep the left side's; ``or`` keeps either side's; one-to-one matching keeps at most
the left side's; ``group_left``/``group_right`` add their listed labels. Functions that keep
their argument's labels (``rate``, ``*_over_time``, ``clamp`` ...) are looked through; any other
function (``label_replace``, ``absent``, ``vector`` ...) makes every label possible.

Parsed with GreptimeTeam's ``promql-parser`` (as :mod:`healer.ruleset.inputs`); pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import promql_parser

from healer.model.addresses import INSTANCE_LABEL

#: Aggregations whose result series are input series (``by``/``without`` only groups them).
_SELECTING = frozenset({"topk", "bottomk", "limitk", "limit_ratio"})
#: Functions whose result has their (one) vector argument's labels, ``__name__`` aside.
_KEEPING = frozenset(
    {
        "abs", "ceil", "floor", "round", "exp", "ln", "log2", "log10", "sqrt", "sgn",
        "clamp", "clamp_min", "clamp_max", "rate", "irate", "increase", "delta", "idelta",
        "deriv", "predict_linear", "changes", "resets", "timestamp", "sort", "sort_desc",
        "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
        "last_over_time", "present_over_time", "stddev_over_time", "stdvar_over_time",
        "quantile_over_time", "mad_over_time", "histogram_quantile",
    }
)  # fmt: skip


@dataclass(frozen=True)
class _Labels:
    """What is known of the result's label names: at most ``only`` (``None``: any), never ``dropped``."""

    only: frozenset[str] | None
    dropped: frozenset[str] = frozenset()

    def absent(self, label: str) -> bool:
        return label in self.dropped or (self.only is not None and label not in self.only)

    def adding(self, labels: Sequence[str]) -> _Labels:
        added = frozenset(labels)
        return _Labels(None if self.only is None else self.only | added, self.dropped - added)


_ANY = _Labels(None)
_NONE = _Labels(frozenset())


def _literal(node: object) -> bool:
    return isinstance(node, promql_parser.NumberLiteral | promql_parser.StringLiteral)


def _labels(node: object) -> _Labels:
    if isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr):
        return _labels(node.expr)
    if isinstance(node, promql_parser.AggregateExpr):
        return _aggregate(node)
    if isinstance(node, promql_parser.BinaryExpr):
        return _binary(node)
    if isinstance(node, promql_parser.Call):
        vectors = [a for a in node.args if not _literal(a)]
        if node.func.name in _KEEPING and len(vectors) == 1:
            return _labels(vectors[0])
        return _ANY
    if _literal(node):
        return _NONE
    return _ANY  # a selector: whatever its series carry


def _aggregate(node: promql_parser.AggregateExpr) -> _Labels:
    op = str(node.op)
    if op in _SELECTING:
        return _labels(node.expr)
    if op == "count_values":
        return _ANY  # adds a label named by its parameter
    modifier = node.modifier
    if modifier is None:
        return _NONE
    listed = frozenset(modifier.labels)
    if modifier.type == promql_parser.AggModifierType.By:
        return _Labels(listed)
    inner = _labels(node.expr)
    return _Labels(None if inner.only is None else inner.only - listed, inner.dropped | listed)


def _binary(node: promql_parser.BinaryExpr) -> _Labels:
    if _literal(node.lhs):
        return _labels(node.rhs)
    if _literal(node.rhs):
        return _labels(node.lhs)
    op = str(node.op)
    left = _labels(node.lhs)
    if op in ("and", "unless"):
        return left
    right = _labels(node.rhs)
    if op == "or":
        only = None if left.only is None or right.only is None else left.only | right.only
        return _Labels(only, left.dropped & right.dropped)
    modifier = node.modifier
    if modifier is None:
        return left
    if modifier.card == promql_parser.VectorMatchCardinality.ManyToOne:
        return left.adding(modifier.group_labels or [])
    if modifier.card == promql_parser.VectorMatchCardinality.OneToMany:
        return right.adding(modifier.group_labels or [])
    return left  # one-to-one: the left side's labels, or fewer (on/ignoring)


@dataclass(frozen=True)
class NodeBlind:
    """A rule whose result certainly carries none of ``node_labels`` nor ``instance``.

    ``kept``: the labels the result can carry (``None``: any but ``dropped``).
    """

    node_labels: tuple[str, ...]
    kept: tuple[str, ...] | None
    dropped: tuple[str, ...]

    def __str__(self) -> str:
        wanted = ", ".join((*self.node_labels, INSTANCE_LABEL))
        if self.kept is not None:
            keeps = f"keeps only ({', '.join(self.kept)})" if self.kept else "keeps no label"
            fix = "keep one in the outer by (...)"
        else:
            keeps = f"drops ({', '.join(self.dropped)})"
            fix = "leave one out of without (...)"
        return (
            f"the expression {keeps}: none of its node_labels nor instance ({wanted}), "
            f"so no finding can name its node ({fix})"
        )


def node_blind(expr: str, node_labels: Sequence[str]) -> NodeBlind | None:
    """A :class:`NodeBlind` when ``expr``'s result certainly lacks every label of ``node_labels``
    and ``instance``; ``None`` when one may be there or ``expr`` does not parse (promtool reports it).
    """
    try:
        labels = _labels(promql_parser.parse(expr))
    except (ValueError, TypeError):
        return None
    wanted = (*node_labels, INSTANCE_LABEL)
    if not all(labels.absent(name) for name in wanted):
        return None
    kept = None if labels.only is None else tuple(sorted(labels.only))
    return NodeBlind(tuple(node_labels), kept, tuple(sorted(labels.dropped)))
