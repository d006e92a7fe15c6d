"""The node page's chart over the incident window: the series of the rule that fired (its
expression without the final comparison, e.g. the InfiniBand counter's ``increase()`` per port for an
InfiniBand rule) with the rule's threshold drawn; GPU temperature and tensor activity when no rule
is known.

Data comes from a Prometheus range query per metric (:mod:`healer.sources.prometheus_range`); this
module turns it into plain numbers for an inline SVG (``templates/_chart.html``), so the chart needs
no JavaScript. Text (GPU labels) is left to the template, which escapes it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from healer.engine.labels import gpu_sort_key
from healer.errors import SourceError
from healer.redaction import redact_text
from healer.ruleset.schema import DEFAULT_NODE_LABELS, Rule, RuleSet
from healer.sources.prometheus_range import PrometheusRange, RangeSeries, node_selector_expr, step_for

WIDTH = 720
HEIGHT = 180
MARGIN_LEFT = 48
MARGIN_RIGHT = 12
MARGIN_TOP = 10
MARGIN_BOTTOM = 24
#: Eight distinguishable colours (a GPU node has eight GPUs); they repeat past that.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


@dataclass(frozen=True)
class ChartMetric:
    """A metric to chart: DCGM field name, title, unit, fixed y range (None: from the data)."""

    metric: str
    title: str
    unit: str
    scale: float = 1.0
    y_min: float | None = None
    y_max: float | None = None


METRICS = (
    ChartMetric("DCGM_FI_DEV_GPU_TEMP", "GPU temperature", "°C"),
    ChartMetric(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Tensor pipe activity", "%", scale=100.0, y_min=0.0, y_max=100.0
    ),
)


#: The final comparison of a rule's expression: ``<lhs> > 78`` (the threshold the rule applies).
_COMPARISON = re.compile(
    r"^(?P<lhs>.+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$",
    re.S,
)


@dataclass(frozen=True)
class RuleSeries:
    """What a rule compares: its expression without the final comparison, the operator and the
    threshold (``None`` when the expression does not end in a comparison with a number)."""

    rule: str
    expr: str
    op: str | None = None
    threshold: float | None = None


def rule_series(rule: Rule) -> RuleSeries:
    """Split ``rule.expr`` into the series it compares and its threshold."""
    expr = rule.expr.strip()
    match = _COMPARISON.match(expr)
    if match is None or match.group("lhs").count("(") != match.group("lhs").count(")"):
        return RuleSeries(rule=rule.name, expr=expr)
    return RuleSeries(
        rule=rule.name, expr=match.group("lhs"), op=match.group("op"), threshold=float(match.group("value"))
    )


@dataclass
class Line:
    """One GPU's line: its label, colour, SVG path data and latest value."""

    label: str
    color: str
    path: str
    last: float | None
    points: int


@dataclass
class Panel:
    """One chart panel, in SVG user units (``WIDTH`` x ``HEIGHT``)."""

    title: str
    unit: str
    lines: list[Line] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    x_anchors: list[str] = field(default_factory=list)
    error: str | None = None
    threshold: tuple[float, str] | None = None  # (y in SVG units, label)
    source: str = ""  # the PromQL charted (the rule's series), for the page and its tests


@dataclass
class Chart:
    """The chart of one node over ``[start, end]``; ``error`` set when no panel could be drawn."""

    start: datetime
    end: datetime
    panels: list[Panel]
    width: int = WIDTH
    height: int = HEIGHT
    error: str | None = None


def chart_window(
    opened_at: datetime | None, closed_at: datetime | None, *, now: datetime
) -> tuple[datetime, datetime]:
    """The window to chart: the incident with some context before and after it (a quarter of its
    length, between one and fifteen minutes), or the last six hours when there is no incident."""
    if opened_at is None:
        return now - timedelta(hours=6), now
    end = min(now, closed_at) if closed_at else now
    pad = min(timedelta(minutes=15), max(timedelta(minutes=1), (end - opened_at) / 4))
    return opened_at - pad, min(now, end + pad) if closed_at else now


def node_labels_of(ruleset: RuleSet | None) -> tuple[str, ...]:
    """The labels that name the node, in the order the rules try them (defaults without rules)."""
    if ruleset is None:
        return DEFAULT_NODE_LABELS
    seen: list[str] = []
    for rule in ruleset.rules:
        for label in rule.node_labels:
            if label not in seen:
                seen.append(label)
    return tuple(seen) or DEFAULT_NODE_LABELS


def build_chart(
    source: PrometheusRange,
    *,
    node: str,
    node_labels: tuple[str, ...],
    start: datetime,
    end: datetime,
    rule: Rule | None = None,
) -> Chart:
    """Query the series of ``rule`` (or, without one, each of :data:`METRICS`) for ``node`` over
    the window and lay out the panels. Never raises for a failed source: the panel carries the
    error for the page to show."""
    step = step_for(start, end)
    if rule is not None:
        panel = _rule_panel(source, rule, node=node, node_labels=node_labels, start=start, end=end, step=step)
        return Chart(start=start, end=end, panels=[panel], error=panel.error)
    panels = []
    for metric in METRICS:
        try:
            series = source.query_range(
                node_selector_expr(metric.metric, node, node_labels), start=start, end=end, step_seconds=step
            )
        except SourceError as exc:
            panels.append(Panel(title=metric.title, unit=metric.unit, error=redact_text(str(exc))))
            continue
        panels.append(_panel(metric, series, start=start, end=end))
    errors = [p.error for p in panels if p.error]
    return Chart(start=start, end=end, panels=panels, error=errors[0] if len(errors) == len(panels) else None)


def _rule_panel(
    source: PrometheusRange,
    rule: Rule,
    *,
    node: str,
    node_labels: tuple[str, ...],
    start: datetime,
    end: datetime,
    step: float,
) -> Panel:
    """The rule's own series for ``node`` with its threshold. The expression is queried as the
    rule wrote it (its aggregation decides the labels) and the node's series are kept here, by the
    rule's node labels (the rule's expression cannot be narrowed to one node in general)."""
    what = rule_series(rule)
    metric = ChartMetric(what.expr, f"{rule.name}: the series it compares", rule.unit or "value")
    try:
        found = source.query_range(what.expr, start=start, end=end, step_seconds=step)
    except SourceError as exc:
        return Panel(title=metric.title, unit=metric.unit, error=str(exc), source=what.expr)
    labels = rule.node_labels or node_labels
    mine = [s for s in found if any(s.labels.get(label) == node for label in labels)]
    panel = _panel(metric, mine, start=start, end=end, threshold=what.threshold)
    panel.source = what.expr
    if what.threshold is not None and panel.error is None:
        panel.threshold = (panel.threshold[0] if panel.threshold else 0.0, f"{what.op} {what.threshold:g}")
    return panel


def _series_label(labels: dict[str, str]) -> str:
    gpu = labels.get("gpu")
    if gpu is not None:
        return f"GPU {gpu}"
    if labels.get("device"):
        port = f" port {labels['port']}" if labels.get("port") else ""
        return f"{labels['device']}{port}"
    return labels.get("UUID", "series")


def _panel(
    metric: ChartMetric,
    series: list[RangeSeries],
    *,
    start: datetime,
    end: datetime,
    threshold: float | None = None,
) -> Panel:
    panel = Panel(title=metric.title, unit=metric.unit)
    series = [s for s in series if s.points]
    if not series:
        panel.error = "no samples in this window"
        return panel
    series.sort(key=lambda s: _sort_key(s.labels))
    values = [v * metric.scale for s in series for _, v in s.points]
    if threshold is not None:
        values.append(threshold)  # the threshold line stays inside the plot
    # Fixed bounds (0-100 %) widen when data falls outside them, so no line leaves the plot.
    lo = min(metric.y_min, min(values)) if metric.y_min is not None else min(values)
    hi = max(metric.y_max, max(values)) if metric.y_max is not None else max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - 1.0, hi + 1.0
    elif metric.y_min is None:
        margin = (hi - lo) * 0.1
        lo, hi = lo - margin, hi + margin
    t0, t1 = start.timestamp(), end.timestamp()
    span = max(t1 - t0, 1.0)
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def x(ts: float) -> float:
        return MARGIN_LEFT + (ts - t0) / span * plot_w

    def y(value: float) -> float:
        return MARGIN_TOP + (1 - (value - lo) / (hi - lo)) * plot_h

    for i, s in enumerate(series):
        coords = [(x(ts), y(v * metric.scale)) for ts, v in s.points]
        path = "M" + " L".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords)
        if len(coords) == 1:
            path += " h2"  # a single sample still shows as a dash
        panel.lines.append(
            Line(
                label=_series_label(s.labels),
                color=PALETTE[i % len(PALETTE)],
                path=path,
                last=s.points[-1][1] * metric.scale,
                points=len(coords),
            )
        )
    if threshold is not None:
        panel.threshold = (y(threshold), f"{threshold:g}")
    panel.y_ticks = [(y(v), f"{v:.4g}") for v in (lo + (hi - lo) * k / 4 for k in range(5))]
    panel.x_ticks = [
        (
            x(t0 + span * k / 4),
            datetime.fromtimestamp(t0 + span * k / 4, tz=start.tzinfo).strftime("%H:%M:%S"),
        )
        for k in range(5)
    ]
    return panel


def _sort_key(labels: dict[str, str]) -> tuple[int, str]:
    return gpu_sort_key(labels.get("gpu"))


class ChartGate:
    """Bounds the node pages' Prometheus range queries: at most ``concurrency`` charts are built at
    once, and a page waits at most ``wait_seconds`` for a turn, then shows the page without the
    chart. With each query bounded by its timeout too, a burst of node pages can neither pile up on
    Prometheus nor hold every request thread.
    """

    def __init__(self, *, concurrency: int = 4, wait_seconds: float = 1.0) -> None:
        self._slots = threading.BoundedSemaphore(concurrency)
        self._wait = wait_seconds

    @contextmanager
    def slot(self) -> Iterator[bool]:
        """Yields True with a turn held, False when none came within ``wait_seconds``."""
        acquired = self._slots.acquire(timeout=self._wait)
        try:
            yield acquired
        finally:
            if acquired:
                self._slots.release()


def busy_chart(*, start: datetime, end: datetime) -> Chart:
    """The chart shown when :class:`ChartGate` gave no turn."""
    message = "too many charts being drawn right now; reload in a moment"
    return Chart(
        start=start,
        end=end,
        panels=[Panel(title=m.title, unit=m.unit, error=message) for m in METRICS],
        error=message,
    )
