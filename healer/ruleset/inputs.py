"""Which metrics a rule's expression reads, and which of them it cannot do without.

Two uses:

- a rule's **node pool** when the rule names none (``pool:``): the nodes that export at least one
  series of its input metrics (:func:`input_metrics`; a ``DCGM_FI_DEV_*`` rule counts over nodes
  running dcgm-exporter, an InfiniBand rule over nodes exporting ``node_infiniband_*``);
- the **exporter check** (``healer doctor exporters``, the Rules page): a rule whose input metric
  no target exports finds nothing, silently: a dcgm-exporter started with a counters CSV that
  lacks the field, or an exporter line that names it differently (field 112 is
  ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` on 3.x, ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` on 4.x;
  reference: exporters-real.md). Against the metric names present fleet-wide:

  - an :class:`Input` is one selector: a metric name, or the alternatives of
    ``{__name__=~"A|B"}`` (any of them present satisfies it);
  - :func:`missing_inputs`: the inputs that must appear for the expression to return anything:
    ``a or b`` needs only one side; ``a unless b`` needs only ``a`` (``b`` is an exception list);
    ``absent(x)`` needs nothing; every other operator and call needs all its operands;
  - :func:`optional_absent`: absent inputs the expression does without (a fallback is used);
  - :func:`check_rule`: one rule's absent inputs, told apart as required, optional, an event
    metric (:data:`EVENT_METRICS`: absent on a healthy fleet until the first event), or a metric
    only some hardware reports (:data:`HARDWARE_METRICS`: the NVLink5 counters of Blackwell GPUs).

Parsed with GreptimeTeam's ``promql-parser`` (the Rust port of Prometheus' parser); pure. Raises
:class:`PromqlSyntax` on text it cannot read (promtool checks the syntax at load time).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import promql_parser

#: Calls that ask for absence: their argument need not exist.
ABSENCE_CALLS = frozenset({"absent", "absent_over_time"})
#: A regular expression that only lists names (``a|b|c``), as ``{__name__=~"..."}`` may.
_NAME_ALTERNATION = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*(?:\|[A-Za-z_:][A-Za-z0-9_:]*)*$")


#: Metrics an exporter emits only once something happened: absent fleet-wide is normal for them
#: (reference: exporters-real.md, dcgm-exporter "Xid").
EVENT_METRICS: Mapping[str, str] = {
    "DCGM_FI_DEV_XID_ERRORS": "dcgm-exporter 4.4.1+ emits no Xid series until a GPU's first Xid",
    "DCGM_EXP_XID_ERRORS_COUNT": "one series per Xid seen in the window: none while no GPU had an Xid",
}


#: NVLink5 link error counters (DCGM fields 1204-1219, dcgm_fields.h) the rules read.
NVLINK5_ERROR_METRICS: tuple[str, ...] = tuple(
    f"DCGM_FI_DEV_NVLINK_COUNT_{name}"
    for name in (
        "RX_MALFORMED_PACKET_ERRORS",
        "RX_BUFFER_OVERRUN_ERRORS",
        "RX_ERRORS",
        "RX_REMOTE_ERRORS",
        "RX_GENERAL_ERRORS",
        "LOCAL_LINK_INTEGRITY_ERRORS",
        "LINK_RECOVERY_FAILED_EVENTS",
        "LINK_RECOVERY_EVENTS",
        "EFFECTIVE_ERRORS",
    )
)

#: Metrics only some hardware (or healer's optional node agent) reports: absent fleet-wide is normal
#: on a fleet without it (NVML
#: answers "not supported" and dcgm-exporter writes no series), and a sign of a counters CSV
#: without the field on a fleet with it.
HARDWARE_METRICS: Mapping[str, str] = {
    **{name: "NVLink5 (Blackwell) GPUs only" for name in NVLINK5_ERROR_METRICS},
    # The node agent is off by default (chart agent.enabled): a fleet without it is not blind.
    "healer_agent_infiniband_hw_counters_total": "nodes running healer's node agent, with InfiniBand HCAs",
}


class PromqlSyntax(ValueError):
    """The expression could not be read (position and what was found)."""


@dataclass(frozen=True, order=True)
class Input:
    """One selector's metric: ``names`` are alternatives (any present satisfies it)."""

    names: tuple[str, ...]

    def __str__(self) -> str:
        return " or ".join(self.names)


@dataclass(frozen=True)
class _Sel:
    input: Input | None  # None: a selector whose name healer cannot tell (a general regex)


@dataclass(frozen=True)
class _Op:
    op: str
    left: _Node
    right: _Node


@dataclass(frozen=True)
class _Call:
    name: str
    args: tuple[_Node, ...]


_Node = _Sel | _Op | _Call | None  # None: a number or string literal


def _selector_input(node: promql_parser.VectorSelector) -> Input | None:
    if node.name:
        return Input((node.name,))
    for matcher in node.matchers.matchers:
        if matcher.name != "__name__":
            continue
        if matcher.op == promql_parser.MatchOp.Equal:
            return Input((matcher.value,))
        # A regex of literal names (`A|B`) lists alternatives; any other regex cannot be checked.
        if matcher.op == promql_parser.MatchOp.Re and _NAME_ALTERNATION.match(matcher.value):
            return Input(tuple(matcher.value.split("|")))
    return None


def _tree(node: object) -> _Node:
    """promql-parser's syntax tree reduced to what presence depends on."""
    if isinstance(node, promql_parser.VectorSelector):
        return _Sel(_selector_input(node))
    if isinstance(node, promql_parser.MatrixSelector):
        return _tree(node.vector_selector)
    if isinstance(node, promql_parser.BinaryExpr):
        return _Op(str(node.op), _tree(node.lhs), _tree(node.rhs))
    if isinstance(node, promql_parser.AggregateExpr):
        args = (node.expr,) if node.param is None else (node.param, node.expr)
        return _Call(str(node.op), tuple(_tree(a) for a in args))
    if isinstance(node, promql_parser.Call):
        return _Call(node.func.name, tuple(_tree(a) for a in node.args))
    if isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr):
        return _tree(node.expr)
    return None  # a number or string literal


def _parse(expr: str) -> _Node:
    try:
        return _tree(promql_parser.parse(expr))
    except (ValueError, TypeError) as exc:  # the parser's errors are ValueErrors
        raise PromqlSyntax(str(exc)) from exc


def _walk(node: _Node) -> Iterator[Input]:
    if isinstance(node, _Sel) and node.input is not None:
        yield node.input
    elif isinstance(node, _Op):
        yield from _walk(node.left)
        yield from _walk(node.right)
    elif isinstance(node, _Call):
        for arg in node.args:
            yield from _walk(arg)


def _unlisted(node: _Node) -> int:
    if isinstance(node, _Sel):
        return int(node.input is None)
    if isinstance(node, _Op):
        return _unlisted(node.left) + _unlisted(node.right)
    if isinstance(node, _Call):
        return sum(_unlisted(a) for a in node.args)
    return 0


def unlisted_selectors(expr: str) -> int:
    """How many selectors of ``expr`` name no metric that can be listed (``{__name__=~"DCGM_.*"}``,
    ``{job="x"}``): their metrics are left out of :func:`inputs`. Raises :class:`PromqlSyntax`."""
    return _unlisted(_parse(expr))


def inputs(expr: str) -> list[Input]:
    """Every input the expression reads, sorted, without repeats."""
    return sorted(set(_walk(_parse(expr))))


def _missing(node: _Node, present: frozenset[str]) -> set[Input]:
    if isinstance(node, _Sel):
        if node.input is None or any(n in present for n in node.input.names):
            return set()
        return {node.input}
    if isinstance(node, _Op):
        left = _missing(node.left, present)
        if node.op == "unless":
            return left
        right = _missing(node.right, present)
        if node.op == "or":
            return left | right if left and right else set()
        return left | right
    if isinstance(node, _Call):
        if node.name in ABSENCE_CALLS:
            return set()
        return set().union(*(_missing(a, present) for a in node.args))
    return set()


def missing_inputs(expr: str, present: Iterable[str]) -> list[Input]:
    """The inputs that must be exported for ``expr`` to return anything, given the metric names
    ``present`` fleet-wide; empty when the expression can see data. Sorted."""
    return sorted(_missing(_parse(expr), frozenset(present)))


def optional_absent(expr: str, present: Iterable[str]) -> list[Input]:
    """Inputs no target exports that ``expr`` does without (the other side of an ``or``, the
    exceptions of an ``unless``, the argument of ``absent``). Sorted."""
    names = frozenset(present)
    needed = set(_missing(_parse(expr), names))
    return sorted(
        i for i in set(_walk(_parse(expr))) if i not in needed and not any(n in names for n in i.names)
    )


def metric_names(exprs: Sequence[str]) -> set[str]:
    """Every metric name the expressions name (each alternative counted)."""
    return {name for expr in exprs for i in inputs(expr) for name in i.names}


@dataclass(frozen=True)
class RuleInputs:
    """One rule's inputs that no target exports fleet-wide.

    ``required``: the rule cannot see anything until one of each appears (it finds nothing now);
    ``optional``: absent, and the rule does without (a fallback branch is used); ``events``:
    absent event metrics (:data:`EVENT_METRICS`), normal on a healthy fleet; ``hardware``: absent
    metrics only some hardware reports (:data:`HARDWARE_METRICS`), normal on a fleet without it.
    """

    rule: str
    required: list[Input] = field(default_factory=list)
    optional: list[Input] = field(default_factory=list)
    events: list[Input] = field(default_factory=list)
    hardware: list[Input] = field(default_factory=list)

    @property
    def blind(self) -> bool:
        """True when the rule reads a required metric no target exports: it can find nothing."""
        return bool(self.required)


def _is_event(i: Input) -> bool:
    return all(n in EVENT_METRICS for n in i.names)


def _is_hardware(i: Input) -> bool:
    return all(n in HARDWARE_METRICS for n in i.names)


def check_rule(name: str, expr: str, present: Iterable[str]) -> RuleInputs:
    """The inputs of rule ``name`` absent given the metric names ``present`` fleet-wide."""
    names = frozenset(present)
    missing = missing_inputs(expr, names)
    return RuleInputs(
        rule=name,
        required=[i for i in missing if not _is_event(i) and not _is_hardware(i)],
        optional=optional_absent(expr, names),
        events=[i for i in missing if _is_event(i)],
        hardware=[i for i in missing if _is_hardware(i)],
    )


def presence_query(exprs: Sequence[str]) -> str:
    """One instant query whose result has one series per metric name of ``exprs`` present now
    (``group by (__name__) ({__name__=~"A|B|..."})``): the names are its ``__name__`` labels."""
    names = sorted(metric_names(exprs))
    return f'group by (__name__) ({{__name__=~"{"|".join(names)}"}})'


def input_metrics(expr: str) -> frozenset[str]:
    """The metric names ``expr`` selects (``foo`` and ``{__name__="foo"}`` alike).

    A selector whose name is a regular expression other than a list of names (``=~"DCGM_.*"``)
    cannot be listed and is left out; an expression that does not parse selects nothing here
    (the rule file's check reports it). Returns an empty set when no name can be listed.
    """
    try:
        found = inputs(expr)
    except PromqlSyntax:  # rule validation reports it
        return frozenset()
    return frozenset(name for i in found for name in i.names)


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
