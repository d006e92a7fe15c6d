"""What a rule compares, as PromQL the node page can chart: its **input series** (the rule's
expression with its filters taken off, so the climb and the recovery show, not only the values
past the threshold) and its **threshold** (numbers, or a series when the rule compares two series),
both narrowed to one node's series.

Read from the rule's syntax tree (GreptimeTeam's ``promql-parser``, as :mod:`healer.ruleset.inputs`):

- ``X and Y`` and ``X unless Y`` chart ``X``: ``Y`` only selects which of ``X``'s series count;
- ``X > 78`` (a comparison with a number, without ``bool``) charts ``X`` with the bound ``> 78``,
  wherever it sits (``max by (gpu) (X >= 46 <= 154 != 47)`` charts ``max by (gpu) (X)`` with the
  bounds ``>= 46`` and ``<= 154``; ``!=`` and ``==`` bounds are listed, not drawn);
- ``X < 0.5 * median`` (two series compared) charts ``X`` with ``0.5 * median`` as the threshold
  series;
- ``or`` keeps both sides (a fallback is part of the value).

Every selector gets the node's matcher (``Hostname="gpu-node-07"``), so Prometheus reads one
node's series, not the fleet's. Pure: no I/O. Raises :class:`~healer.ruleset.inputs.PromqlSyntax`
on an expression the parser cannot read.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import promql_parser
from promql_parser import Expr

from healer.ruleset.inputs import PromqlSyntax
from healer.sources.prometheus_range import promql_string

COMPARISONS = frozenset({">", "<", ">=", "<=", "==", "!="})
#: ``3 < x`` read as ``x > 3``.
_FLIPPED = {">": "<", "<": ">", ">=": "<=", "<=": ">=", "==": "==", "!=": "!="}
#: Bounds drawn as a line (an equality is a set of values, not a line).
DRAWN = frozenset({">", "<", ">=", "<="})


@dataclass(frozen=True)
class Bound:
    """One comparison with a number: ``op`` (``>``, ``<=`` ...) and ``value``."""

    op: str
    value: float

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


@dataclass(frozen=True)
class RuleQuery:
    """What to chart for a rule: ``series`` (PromQL of its input series), ``bounds`` (its
    comparisons with numbers, innermost first: the one next to the series leads),
    ``threshold_series`` (PromQL of the series it is compared with, None when it compares with
    numbers) and ``filters`` (the ``and``/``unless``
    conditions taken off, as PromQL, for the page to list)."""

    series: str
    bounds: tuple[Bound, ...] = ()
    threshold_series: str | None = None
    filters: tuple[str, ...] = field(default_factory=tuple)

    @property
    def drawn(self) -> tuple[Bound, ...]:
        """The bounds drawn as lines: ``>``, ``<``, ``>=``, ``<=``."""
        return tuple(b for b in self.bounds if b.op in DRAWN)


def _unparen(node: Expr) -> Expr:
    while isinstance(node, promql_parser.ParenExpr):
        node = node.expr
    return node


def _is_filter(node: Expr) -> bool:
    return isinstance(node, promql_parser.BinaryExpr) and str(node.op) in ("and", "unless")


def _is_comparison(node: Expr) -> bool:
    if not isinstance(node, promql_parser.BinaryExpr) or str(node.op) not in COMPARISONS:
        return False
    return not (node.modifier is not None and node.modifier.return_bool)


def _number(node: Expr) -> float | None:
    node = _unparen(node)
    return float(node.val) if isinstance(node, promql_parser.NumberLiteral) else None


def _scoped(node: Expr, matchers: Mapping[str, str]) -> Expr:
    """``node`` with every vector selector narrowed by ``matchers`` (label -> value)."""
    extra = ",".join(f"{label}={promql_string(value)}" for label, value in matchers.items())

    def pre(n: Expr) -> Expr | None:
        if not isinstance(n, promql_parser.VectorSelector) or not extra:
            return None
        text = str(n)
        # A metric name cannot hold "{"; offset and @ come after the closing brace.
        start, end = text.index("{"), text.rindex("}")
        inner = text[start + 1 : end]
        return promql_parser.parse(f"{text[: start + 1]}{inner + ',' if inner else ''}{extra}{text[end:]}")

    return promql_parser.transform(node, pre, None)


def _safe(expr: str) -> bool:
    # promql-parser prints label values and strings without escaping them: refuse anything it
    # could print wrong (a quote or backslash in a value), rather than query something else.
    return "\\" not in expr and expr.count('"') % 2 == 0


def rule_query(expr: str, matchers: Mapping[str, str] | None = None) -> RuleQuery:
    """Split ``expr`` into its input series and threshold, each narrowed by ``matchers`` (the
    node's label and value, e.g. ``{"Hostname": "gpu-node-07"}``; none: the fleet's series).

    Remembers its last :data:`CACHED` answers: a long expression (``GpuFatalXid``'s chain of 90
    comparisons) takes tens of milliseconds to rewrite, and every node page and verdict asks.

    Raises:
        PromqlSyntax: the expression cannot be read, or holds a quote or backslash in a label
            value or string (the parser would print it back wrong).
    """
    return _rule_query(expr, tuple(sorted((matchers or {}).items())))


#: How many (expression, node) answers :func:`rule_query` remembers.
CACHED = 4096


@functools.lru_cache(maxsize=CACHED)
def _rule_query(expr: str, scope_items: tuple[tuple[str, str], ...]) -> RuleQuery:
    matchers = dict(scope_items)
    if not _safe(expr) or any(not _safe(promql_string(v)[1:-1]) for v in (matchers or {}).values()):
        raise PromqlSyntax("a label value or string with a quote or backslash cannot be charted")
    try:
        tree = promql_parser.parse(expr)
    except (ValueError, TypeError) as exc:
        raise PromqlSyntax(str(exc)) from exc
    filters: list[str] = []
    node = _unparen(tree)
    while _is_filter(node):
        assert isinstance(node, promql_parser.BinaryExpr)
        text, left = str(node), str(node.lhs)
        filters.append(text[len(left) :].strip() if text.startswith(left) else f"{node.op} {node.rhs}")
        node = _unparen(node.lhs)
    bounds: list[Bound] = []
    threshold: list[Expr] = []

    def pre(n: Expr) -> Expr | None:
        # Inner filters (inside an aggregation) select series too: keep their left side.
        return n.lhs if isinstance(n, promql_parser.BinaryExpr) and _is_filter(n) else None

    def post(n: Expr) -> Expr | None:
        if not isinstance(n, promql_parser.BinaryExpr) or not _is_comparison(n):
            return None
        op = str(n.op)
        right, left = _number(n.rhs), _number(n.lhs)
        if right is not None:
            bounds.append(Bound(op, right))
            return n.lhs
        if left is not None:
            bounds.append(Bound(_FLIPPED[op], left))
            return n.rhs
        if not threshold:
            threshold.append(n.rhs)
        return n.lhs

    scope = dict(matchers or {})
    try:
        series = str(_scoped(_unparen(promql_parser.transform(node, pre, post)), scope))
        against = str(_scoped(_unparen(threshold[0]), scope)) if threshold else None
    except (ValueError, TypeError) as exc:  # a selector the parser printed in a way it cannot read
        raise PromqlSyntax(str(exc)) from exc
    return RuleQuery(
        series=series,
        bounds=tuple(dict.fromkeys(bounds)),
        threshold_series=against,
        filters=tuple(filters),
    )


def node_matchers(
    finding_labels: Mapping[str, object] | None, node: str, node_labels: Sequence[str]
) -> dict[str, str]:
    """The label that names the node in the rule's series: the first of ``node_labels`` the
    finding carries (with the finding's value), else its ``instance`` (InfiniBand rules map an
    exporter's address to the node), else ``{node_labels[0]: node}``."""
    labels = finding_labels or {}
    for label in node_labels:
        if isinstance(labels.get(label), str) and labels[label]:
            return {label: str(labels[label])}
    if isinstance(labels.get("instance"), str) and labels["instance"]:
        return {"instance": str(labels["instance"])}
    return {node_labels[0]: node} if node_labels else {}
