"""The InfiniBand device filter: one setting says which HCAs count, every rule obeys it.

node_exporter lists every RDMA device (compute fabric, storage, management, RoCE, SR-IOV virtual
functions; rules/README.md "Which InfiniBand devices count"). The settings' ``infiniband``
group names the compute HCAs once, as two anchored Prometheus regexes on the ``device`` label
(``device_include``, default ``.+``; ``device_exclude``, default ``""``: none). At load time
:func:`apply_device_filter` writes ``device=~"<include>", device!~"<exclude>"`` into every
``node_infiniband_*`` selector of a rule's expression, so the rules healer queries, shows and
exports (``healer rules export``) all carry it.

Precedence: the setting decides. A selector in a rule file may carry no ``device`` matcher (the
filter is added) or exactly the filter's two matchers (left as they are); any other ``device``
matcher on a ``node_infiniband_*`` selector is a :class:`DeviceMatcherConflict`, reported at its
place in the file by the loader: two places saying which HCAs count would disagree silently.

The regexes are checked by :func:`check_device_regex` with GreptimeTeam's ``promql-parser`` (Rust's
``regex`` crate, RE2 syntax: no look-around, no back-references) plus the two RE2 limits that
crate does not enforce (repeat counts over 1000, flags other than ``imsU``). Matcher values are
written as PromQL string literals (quotes and backslashes escaped), never pasted in raw. Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import promql_parser

#: The metrics the filter applies to: node_exporter's InfiniBand collector, and the node agent's
#: InfiniBand counters (healer/nodeagent/exposition.py), which carry the same `device` label.
INFINIBAND_PREFIXES = ("node_infiniband_", "healer_agent_infiniband_")
#: The prefix of the probe selector the filter's matchers are parsed from.
INFINIBAND_PREFIX = "node_infiniband_"
#: node_exporter's label naming the HCA (``mlx5_0``).
DEVICE_LABEL = "device"
#: Keywords followed by a parenthesised list of label names (never selectors).
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
#: RE2's largest repeat count (``a{1001}`` is "invalid repeat count" in Go).
_RE2_MAX_REPEAT = 1000
_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")
_FLAGS = re.compile(r"\(\?([A-Za-z-]+)[:)]")
_IDENT_START = re.compile(r"[A-Za-z_:]")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


class DeviceMatcherConflict(ValueError):
    """A rule's ``node_infiniband_*`` selector sets ``device`` otherwise than the filter.

    ``offset`` is the 0-based character offset of the selector in the expression text.
    """

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal (Go escapes: ``\\"``, ``\\\\``, ``\\uXXXX``)."""
    return json.dumps(value)


def check_device_regex(value: str) -> str:
    """Return ``value`` if Prometheus accepts it as a ``device`` regex; raise ``ValueError`` saying why.

    Prometheus anchors it (``^(?:value)$``) and compiles it with Go's RE2.
    """
    try:
        promql_parser.parse(f"{INFINIBAND_PREFIX}probe{{{DEVICE_LABEL}=~{promql_string(value)}}}")
    except ValueError as exc:
        raise ValueError(
            f"not a regular expression Prometheus accepts (RE2 syntax): {value!r}: {exc}"
        ) from exc
    for m in _REPEAT.finditer(value):
        counts = [int(n) for n in m.groups() if n]
        if any(n > _RE2_MAX_REPEAT for n in counts):
            raise ValueError(f"repeat count over {_RE2_MAX_REPEAT} in {value!r}: RE2 refuses it")
    for m in _FLAGS.finditer(value):
        if set(m.group(1)) - set("imsU-"):
            raise ValueError(f"flags {m.group(1)!r} in {value!r}: RE2 knows only i, m, s and U")
    return value


@dataclass(frozen=True)
class DeviceFilter:
    """Which HCAs (node_exporter's ``device`` label) the InfiniBand rules count.

    Both are anchored Prometheus regexes; a device counts when it matches ``include`` and not
    ``exclude``. Raises ``ValueError`` on a regex Prometheus would refuse, or an empty ``include``
    (it would match no device).
    """

    include: str = ".+"
    exclude: str = ""

    def __post_init__(self) -> None:
        if not self.include:
            raise ValueError("device_include is empty: it matches no device (every device: '.+')")
        check_device_regex(self.include)
        check_device_regex(self.exclude)

    def matchers(self) -> str:
        """``device=~"<include>", device!~"<exclude>"`` as written into a selector."""
        return f"{DEVICE_LABEL}=~{promql_string(self.include)}, {DEVICE_LABEL}!~{promql_string(self.exclude)}"

    def describe(self) -> str:
        """The setting as a user writes it, for messages."""
        return f"infiniband.device_include {self.include!r}, infiniband.device_exclude {self.exclude!r}"


#: Every device counts: the default of the settings.
ALL_DEVICES = DeviceFilter()


@dataclass(frozen=True)
class _Selector:
    start: int  # the metric name's first character
    name_end: int  # just past the metric name
    brace: tuple[int, int] | None  # offsets of "{" and "}" when the selector has matchers


def _skip_string(text: str, i: int) -> int:
    """Index just past the string literal starting at ``text[i]`` (``"``, ``'`` or a backtick)."""
    quote = text[i]
    i += 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return i


def _skip_space(text: str, i: int) -> int:
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text[i] == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
        else:
            break
    return i


def _closing(text: str, i: int, close: str) -> int:
    """Index of the ``close`` character ending the block opened at ``text[i]`` (strings skipped)."""
    i += 1
    while i < len(text):
        if text[i] in "\"'`":
            i = _skip_string(text, i)
            continue
        if text[i] == close:
            return i
        i += 1
    return i


def _infiniband_selectors(text: str) -> Iterator[_Selector]:
    """The ``node_infiniband_*`` selectors of a PromQL text, in order, found lexically: strings,
    comments, label lists (``by (...)`` and the like) and matcher blocks are skipped."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'`":
            i = _skip_string(text, i)
        elif ch == "#":
            i = _skip_space(text, i)
        elif ch == "{":
            i = _closing(text, i, "}") + 1
        elif ch.isdigit() or (ch == "." and i + 1 < len(text) and text[i + 1].isdigit()):
            while i < len(text) and (text[i].isalnum() or text[i] in "._"):
                i += 1
        elif _IDENT_START.match(ch):
            m = _IDENT.match(text, i)
            assert m is not None
            word, end = m.group(), m.end()
            after = _skip_space(text, end)
            if word in _LABEL_LIST_KEYWORDS and after < len(text) and text[after] == "(":
                i = _closing(text, after, ")") + 1
            elif word.startswith(INFINIBAND_PREFIXES) and not (after < len(text) and text[after] == "("):
                if after < len(text) and text[after] == "{":
                    close = _closing(text, after, "}")
                    yield _Selector(i, end, (after, close))
                    i = close + 1
                else:
                    yield _Selector(i, end, None)
                    i = end
            else:
                i = end
        else:
            i += 1


def _vector_selectors(node: object) -> Iterator[promql_parser.VectorSelector]:
    if isinstance(node, promql_parser.VectorSelector):
        yield node
    elif isinstance(node, promql_parser.MatrixSelector):
        yield node.vector_selector
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from _vector_selectors(node.lhs)
        yield from _vector_selectors(node.rhs)
    elif isinstance(node, promql_parser.AggregateExpr):
        if node.param is not None:
            yield from _vector_selectors(node.param)
        yield from _vector_selectors(node.expr)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from _vector_selectors(arg)
    elif isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr):
        yield from _vector_selectors(node.expr)


def _infiniband_name(selector: promql_parser.VectorSelector) -> str | None:
    """The selector's metric when it is an InfiniBand one, by name or by a ``__name__`` matcher."""
    if selector.name:
        return selector.name if selector.name.startswith(INFINIBAND_PREFIXES) else None
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__" and "infiniband" in matcher.value:
            return matcher.value
    return None


#: promql-parser's match operators (unhashable enums: keyed by their text) as PromQL writes them.
_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}


def _device_matchers(selector: promql_parser.VectorSelector) -> set[tuple[str, str]]:
    """The selector's ``device`` matchers as ``(operator, value)``, ``or`` alternatives included."""
    groups = [selector.matchers.matchers, *selector.matchers.or_matchers]
    return {(_OPS[str(m.op)], m.value) for group in groups for m in group if m.name == DEVICE_LABEL}


def device_matchers_in(expr: str) -> frozenset[tuple[str, str]] | None:
    """The ``device`` matchers, as ``(operator, value)``, that every ``node_infiniband_*`` selector
    of ``expr`` carries alike (the filter, once applied); None when the expression has no such
    selector, its selectors disagree, or it does not parse."""
    try:
        parsed = promql_parser.parse(expr)
    except (ValueError, TypeError):
        return None
    found = {
        frozenset(_device_matchers(s)) for s in _vector_selectors(parsed) if _infiniband_name(s) is not None
    }
    return next(iter(found)) if len(found) == 1 else None


def _filter_matchers(device_filter: DeviceFilter) -> set[tuple[str, str]]:
    parsed = promql_parser.parse(f"{INFINIBAND_PREFIX}probe{{{device_filter.matchers()}}}")
    assert isinstance(parsed, promql_parser.VectorSelector)
    return _device_matchers(parsed)


def apply_device_filter(expr: str, device_filter: DeviceFilter) -> str:
    """``expr`` with the filter's ``device`` matchers in every ``node_infiniband_*`` selector.

    Selectors that already carry exactly the filter's two matchers are left as written; an
    expression without InfiniBand selectors comes back unchanged.

    Raises:
        DeviceMatcherConflict: a selector sets ``device`` otherwise, or names an InfiniBand
            metric through ``__name__`` (the filter cannot be written into it); ``offset`` says where.
        ValueError: ``expr`` is not PromQL promql-parser can read (only raised when the text
            names an InfiniBand metric; promtool reports the syntax itself).
    """
    if "infiniband" not in expr:  # neither a node_infiniband_* name nor a __name__ matcher on one
        return expr
    tree = promql_parser.parse(expr)
    wanted = _filter_matchers(device_filter)
    expected = [s for s in _vector_selectors(tree) if _infiniband_name(s) is not None]
    if not expected:
        return expr
    for s in expected:
        if not s.name:
            offset = max(expr.find("__name__"), 0)
            raise DeviceMatcherConflict(
                f"{{__name__=...{_infiniband_name(s)}...}}: write the InfiniBand metric's name before the "
                "braces (node_infiniband_x{...}) so that the InfiniBand device filter can be applied",
                offset,
            )
    found = list(_infiniband_selectors(expr))
    out: list[str] = []
    last = 0
    for sel in found:
        end = sel.brace[1] + 1 if sel.brace else sel.name_end
        piece = promql_parser.parse(expr[sel.start : end])
        assert isinstance(piece, promql_parser.VectorSelector)
        if piece.matchers.or_matchers:
            raise DeviceMatcherConflict(
                f"{piece.name}{{... or ...}}: the InfiniBand device filter cannot be written into "
                "alternatives inside braces; join two selectors with `or` instead",
                sel.start,
            )
        have = _device_matchers(piece)
        if have == wanted:
            continue
        if have:
            written = ", ".join(f"{DEVICE_LABEL}{op}{promql_string(value)}" for op, value in sorted(have))
            raise DeviceMatcherConflict(
                f"{piece.name} selects {written}, but which HCAs count is the settings' InfiniBand "
                f"device filter ({device_filter.describe()}): remove the device matcher from the rule, "
                "or set the filter in the settings (rules/README.md, 'Which InfiniBand devices count')",
                sel.start,
            )
        if sel.brace is None:
            out += [expr[last : sel.name_end], "{", device_filter.matchers(), "}"]
            last = sel.name_end
        else:
            open_at, close_at = sel.brace
            inner_empty = not expr[open_at + 1 : close_at].strip()
            out += [expr[last : open_at + 1], device_filter.matchers(), "" if inner_empty else ", "]
            last = open_at + 1
    out.append(expr[last:])
    rewritten = "".join(out)
    _verify(rewritten, wanted, len(expected))
    return rewritten


def _verify(rewritten: str, wanted: set[tuple[str, str]], count: int) -> None:
    """Every InfiniBand selector of the result carries exactly the filter (or raise ``ValueError``)."""
    selectors = [s for s in _vector_selectors(promql_parser.parse(rewritten)) if _infiniband_name(s)]
    if len(selectors) != count or any(_device_matchers(s) != wanted for s in selectors):
        raise ValueError("the InfiniBand device filter could not be written into this expression")
