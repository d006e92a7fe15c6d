"""promtool's ``input_series`` notation, expanded, and written as OpenMetrics for ``promtool tsdb``.

The notation (``promtool test rules``, prometheus/prometheus ``docs/configuration/unit_testing_rules.md``):
``values`` is a space-separated list of tokens; the i-th value is the sample at ``i * interval``.

- ``a``: one value; ``_``: one missing sample; ``stale``: a staleness marker;
- ``a+bxn`` / ``a-bxn``: ``n + 1`` values ``a, a+b, ... a+n*b``;
- ``axn``: ``n + 1`` times ``a``; ``_xn``: ``n`` missing samples;
- numbers may be ``Inf``, ``-Inf``, ``NaN``, and use exponents.

OpenMetrics has no staleness marker, so ``stale`` could only be written as a gap (the last value
lingering for the 5 minute lookback where promtool drops it at once): :mod:`healer.ruletest.spec`
refuses it in the tests healer's engine checks, and promtool's own tests are run by promtool.

Errors: :class:`SeriesError` with the offending token or selector.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

_NUMBER = r"[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|Inf|inf|NaN|nan)"
_EXPAND = re.compile(rf"^(?P<a>{_NUMBER})(?:(?P<op>[-+])(?P<b>{_NUMBER}))?x(?P<n>\d+)$")
_MISSING_X = re.compile(r"^_x(?P<n>\d+)$")
_SELECTOR = re.compile(r"^\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(?:\{(?P<labels>.*)\})?\s*$", re.S)
_LABEL = re.compile(r'\s*(?P<k>[a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?P<v>(?:[^"\\]|\\.)*)"\s*(?:,|$)')


class SeriesError(ValueError):
    """An ``input_series`` entry promtool would reject."""


@dataclass(frozen=True)
class Series:
    """One input series: its metric name, labels, and values by step (None = no sample)."""

    name: str
    labels: tuple[tuple[str, str], ...]
    values: tuple[float | None, ...]

    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


def _number(text: str) -> float:
    lowered = text.lower()
    if lowered in ("inf", "+inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    return float(text)


def expand_values(text: str) -> list[float | None]:
    """The values of promtool's notation, one per step (None = missing or stale)."""
    out: list[float | None] = []
    for token in str(text).split():
        if token in ("_", "stale"):
            out.append(None)
            continue
        missing = _MISSING_X.match(token)
        if missing:
            out.extend([None] * int(missing.group("n")))
            continue
        m = _EXPAND.match(token)
        if m:
            a = _number(m.group("a"))
            b = _number(m.group("b")) if m.group("b") else 0.0
            if m.group("op") == "-":
                b = -b
            out.extend(a + i * b for i in range(int(m.group("n")) + 1))
            continue
        try:
            out.append(_number(token))
        except ValueError:
            raise SeriesError(f"not a value in promtool's notation: {token!r}") from None
    return out


def parse_selector(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``metric{a="1", b="2"}`` → (``metric``, sorted labels); ``{__name__="m", ...}`` works too."""
    m = _SELECTOR.match(text)
    if not m:
        raise SeriesError(f"not a series selector: {text!r}")
    labels: dict[str, str] = {}
    body = (m.group("labels") or "").strip().rstrip(",")
    pos = 0
    while pos < len(body):
        lm = _LABEL.match(body, pos)
        if not lm or lm.end() == pos:
            raise SeriesError(f"cannot read the labels of {text!r} at {body[pos:]!r}")
        labels[lm.group("k")] = bytes(lm.group("v"), "utf-8").decode("unicode_escape")
        pos = lm.end()
    name = m.group("name") or labels.pop("__name__", "")
    labels.pop("__name__", None)
    if not name:
        raise SeriesError(f"series without a metric name: {text!r}")
    return name, tuple(sorted(labels.items()))


def parse_series(selector: str, values: str) -> Series:
    """One ``input_series`` entry."""
    name, labels = parse_selector(selector)
    return Series(name=name, labels=labels, values=tuple(expand_values(values)))


def _om_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _om_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics(series: Iterable[tuple[Series, float, float]]) -> str:
    """OpenMetrics text (``# EOF`` terminated) for ``(series, start, interval)`` triples: sample i of
    a series at ``start + i * interval`` seconds. Families are kept together, as the format requires."""
    by_name: dict[str, list[str]] = {}
    for s, start, interval in series:
        body = ",".join(f'{k}="{_om_label(v)}"' for k, v in s.labels)
        head = f"{s.name}{{{body}}}" if body else s.name
        lines = by_name.setdefault(s.name, [])
        for i, value in enumerate(s.values):
            if value is not None:
                lines.append(f"{head} {_om_value(value)} {start + i * interval:.3f}")
    out: list[str] = []
    for name in sorted(by_name):
        out.append(f"# TYPE {name} gauge")
        out.extend(by_name[name])
    out.append("# EOF")
    return "\n".join(out) + "\n"
