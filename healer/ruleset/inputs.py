"""Which metrics a rule's expression reads, and which of them it cannot do without.

A rule whose input metric no target exports finds nothing, silently: a dcgm-exporter started with
a counters CSV that lacks the field, or an exporter line that names it differently (field 112 is
``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` on 3.x, ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` on 4.x;
reference: exporters-real.md). This module reads an expression's structure (a small PromQL
parser: selectors, binary operators with their modifiers, aggregations, calls, ranges, subqueries,
``offset``/``@``) and answers, against the metric names present fleet-wide:

- an :class:`Input` is one selector: a metric name, or the alternatives of
  ``{__name__=~"A|B"}`` (any of them present satisfies it);
- :func:`missing_inputs`: the inputs that must appear for the expression to return anything:
  ``a or b`` needs only one side; ``a unless b`` needs only ``a`` (``b`` is an exception list);
  ``absent(x)`` needs nothing; every other operator and call needs all its operands;
- :func:`optional_absent`: absent inputs the expression does without (a fallback is used);
- :func:`check_rules`: per rule, its absent inputs, told apart as required, optional, or an
  event metric (:data:`EVENT_METRICS`: absent on a healthy fleet until the first event).

Pure; no Prometheus round trip (Prometheus 2.42 has no parse endpoint). Raises
:class:`PromqlSyntax` on text it cannot read (promtool checks the syntax at load time).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

#: Aggregation operators (they take ``by``/``without`` before or after their arguments).
AGGREGATIONS = frozenset(
    {
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    }
)  # fmt: skip
#: Calls that ask for absence: their argument need not exist.
ABSENCE_CALLS = frozenset({"absent", "absent_over_time"})
#: Binary operators by precedence, lowest first (Prometheus's ``parser/lex.go``); ``^`` binds right.
LEVELS: tuple[frozenset[str], ...] = (
    frozenset({"or"}),
    frozenset({"and", "unless"}),
    frozenset({"==", "!=", "<=", "<", ">=", ">"}),
    frozenset({"+", "-"}),
    frozenset({"*", "/", "%", "atan2"}),
    frozenset({"^"}),
)
_NAME = r"[A-Za-z_:][A-Za-z0-9_:]*"
_TOKEN = re.compile(
    rf"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<braces>\{{(?:[^}}"'`]|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)*\}})
  | (?P<brackets>\[[^\]]*\])
  | (?P<number>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?(?:\d+(?:ms|[smhdwy]))*
        |(?:[Ii]nf|NaN)(?![A-Za-z0-9_:]))
  | (?P<name>{_NAME})
  | (?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=(),@])
    """,
    re.VERBOSE,
)
_NAME_MATCHER = re.compile(r"""__name__\s*(=~|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)""")
_ALTERNATIVES = re.compile(rf"{_NAME}(?:\|{_NAME})*")


#: Metrics an exporter emits only once something happened: absent fleet-wide is normal for them
#: (reference: exporters-real.md, dcgm-exporter "Xid").
EVENT_METRICS: Mapping[str, str] = {
    "DCGM_FI_DEV_XID_ERRORS": "dcgm-exporter 4.4.1+ emits no Xid series until a GPU's first Xid",
    "DCGM_EXP_XID_ERRORS_COUNT": "one series per Xid seen in the window: none while no GPU had an Xid",
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


def _tokens(expr: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise PromqlSyntax(f"unexpected {expr[pos : pos + 20]!r} at {pos}")
        kind = m.lastgroup or ""
        if kind != "space":
            out.append((kind, m.group(), pos))
        pos = m.end()
    return out


def _selector_input(name: str | None, braces: str | None) -> Input | None:
    if name is not None:
        return Input((name,))
    m = _NAME_MATCHER.search(braces or "")
    if m is None:
        return None
    value = m.group(2)[1:-1]
    if m.group(1) == "=":
        return Input((value,))
    # A regex of literal names (`A|B`) lists alternatives; any other regex cannot be checked.
    return Input(tuple(value.split("|"))) if _ALTERNATIVES.fullmatch(value) else None


class _Parser:
    def __init__(self, expr: str) -> None:
        self.toks = _tokens(expr)
        self.i = 0

    def peek(self, ahead: int = 0) -> tuple[str, str, int] | None:
        j = self.i + ahead
        return self.toks[j] if j < len(self.toks) else None

    def take(self, text: str | None = None) -> tuple[str, str, int]:
        tok = self.peek()
        if tok is None or (text is not None and tok[1] != text):
            where = f"{tok[1]!r} at {tok[2]}" if tok else "the end"
            raise PromqlSyntax(f"expected {text or 'more'}, found {where}")
        self.i += 1
        return tok

    def at(self, *texts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[1] in texts

    def parse(self) -> _Node:
        node = self.binary(0)
        if self.peek() is not None:
            tok = self.take()
            raise PromqlSyntax(f"unexpected {tok[1]!r} at {tok[2]}")
        return node

    def binary(self, level: int) -> _Node:
        if level == len(LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.at(*LEVELS[level]):
            op = self.take()[1]
            self.modifiers()
            # `^` is right-associative: its right side may hold another `^`.
            right = self.binary(level if op == "^" else level + 1)
            left = _Op(op, left, right)
        return left

    def modifiers(self) -> None:
        if self.at("bool"):
            self.take()
        if self.at("on", "ignoring"):
            self.take()
            self.labels()
        if self.at("group_left", "group_right"):
            self.take()
            if self.at("("):
                self.labels()

    def labels(self) -> None:
        self.take("(")
        while not self.at(")"):
            self.take()
        self.take(")")

    def unary(self) -> _Node:
        if self.at("-", "+"):
            self.take()
            return self.unary()
        return self.postfix(self.primary())

    def postfix(self, node: _Node) -> _Node:
        while True:
            tok = self.peek()
            if tok is None:
                return node
            if tok[0] == "brackets":
                self.take()
            elif tok[1] == "offset":
                self.take()
                if self.at("-", "+"):
                    self.take()
                self.take()
            elif tok[1] == "@":
                self.take()
                if self.at("-", "+"):
                    self.take()
                name = self.take()[1]
                if name in ("start", "end"):
                    self.take("(")
                    self.take(")")
            else:
                return node

    def primary(self) -> _Node:
        kind, text, _ = self.take()
        if text == "(":
            node = self.binary(0)
            self.take(")")
            return node
        if kind in ("number", "string"):
            return None
        if kind == "braces":
            return _Sel(_selector_input(None, text))
        if kind != "name":
            raise PromqlSyntax(f"unexpected {text!r}")
        if text in AGGREGATIONS:
            if self.at("by", "without"):
                self.take()
                self.labels()
            args = self.arguments()
            if self.at("by", "without"):
                self.take()
                self.labels()
            return _Call(text, args)
        if self.at("("):
            return _Call(text, self.arguments())
        tok = self.peek()
        if tok is not None and tok[0] == "braces":
            self.take()
        return _Sel(_selector_input(text, None))

    def arguments(self) -> tuple[_Node, ...]:
        self.take("(")
        args: list[_Node] = []
        while not self.at(")"):
            args.append(self.binary(0))
            if not self.at(")"):
                self.take(",")
        self.take(")")
        return tuple(args)


def _parse(expr: str) -> _Node:
    return _Parser(expr).parse()


def _walk(node: _Node) -> Iterator[Input]:
    if isinstance(node, _Sel) and node.input is not None:
        yield node.input
    elif isinstance(node, _Op):
        yield from _walk(node.left)
        yield from _walk(node.right)
    elif isinstance(node, _Call):
        for arg in node.args:
            yield from _walk(arg)


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
    absent event metrics (:data:`EVENT_METRICS`), normal on a healthy fleet.
    """

    rule: str
    required: list[Input] = field(default_factory=list)
    optional: list[Input] = field(default_factory=list)
    events: list[Input] = field(default_factory=list)

    @property
    def blind(self) -> bool:
        """True when the rule reads a required metric no target exports: it can find nothing."""
        return bool(self.required)


def _is_event(i: Input) -> bool:
    return all(n in EVENT_METRICS for n in i.names)


def check_rule(name: str, expr: str, present: Iterable[str]) -> RuleInputs:
    """The inputs of rule ``name`` absent given the metric names ``present`` fleet-wide."""
    names = frozenset(present)
    missing = missing_inputs(expr, names)
    return RuleInputs(
        rule=name,
        required=[i for i in missing if not _is_event(i)],
        optional=optional_absent(expr, names),
        events=[i for i in missing if _is_event(i)],
    )


def presence_query(exprs: Sequence[str]) -> str:
    """One instant query whose result has one series per metric name of ``exprs`` present now
    (``group by (__name__) ({__name__=~"A|B|..."})``): the names are its ``__name__`` labels."""
    names = sorted(metric_names(exprs))
    return f'group by (__name__) ({{__name__=~"{"|".join(names)}"}})'
