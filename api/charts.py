"""The node page's chart over the incident window: the **input series** of the rule that fired
for this node (:mod:`api.rule_query`: its expression with the filters and comparisons taken off,
e.g. ``max by (gpu) (DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-07"})`` for ``GpuTooHot``, so the climb
and the recovery show), its threshold drawn dashed (a line per numeric bound, or the threshold
series when the rule compares two series), the finding's pending and firing spans shaded, and the
incident's decisions marked on the time axis; titled by the rule and its unit. GPU temperature and
tensor activity when no rule is known.

Every query is narrowed to the node by the label its finding carries, so a node page costs
Prometheus one node's series, not the fleet's. Data comes from range queries
(:mod:`healer.sources.prometheus_range`); this module turns them into plain numbers for an inline
SVG (``templates/_chart.html``), so the chart needs no JavaScript. Text (GPU labels) is left to the
template, which escapes it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from api.rule_query import RuleQuery, node_matchers, rule_query
from healer.engine.labels import gpu_sort_key
from healer.errors import SourceError
from healer.redaction import redact_text
from healer.ruleset.inputs import PromqlSyntax
from healer.ruleset.schema import DEFAULT_NODE_LABELS, Rule, RuleSet
from healer.sources.prometheus_range import PrometheusRange, RangeSeries, node_selector_expr, step_for

WIDTH = 720
HEIGHT = 180
MARGIN_LEFT = 48
MARGIN_RIGHT = 12
MARGIN_TOP = 10
MARGIN_BOTTOM = 24
#: Eight distinguishable colours (a GPU node has eight GPUs); they repeat past that.
#: The threshold's colour (lines and series), kept out of :data:`PALETTE`.
THRESHOLD_COLOR = "#cf222e"
PALETTE = ("#1f77b4", "#bcbd22", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


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


@dataclass(frozen=True)
class RuleSeries:
    """What a rule compares: its input series (PromQL, the fleet's), the operator and the threshold
    of its comparison with a number (``None`` when it compares with none, or with several)."""

    rule: str
    expr: str
    op: str | None = None
    threshold: float | None = None


def rule_series(rule: Rule) -> RuleSeries:
    """Split ``rule.expr`` into the series it compares and its threshold (:mod:`api.rule_query`)."""
    try:
        what = rule_query(rule.expr)
    except PromqlSyntax:
        return RuleSeries(rule=rule.name, expr=rule.expr.strip())
    # One comparison with a number is a threshold; a set of them (GpuFatalXid's ">= 46 and
    # <= 154 and != 47 ...": the fatal Xid codes) is not, and the verdict names none.
    lead = what.bounds[0] if len(what.bounds) == 1 else None
    return RuleSeries(
        rule=rule.name,
        expr=what.series,
        op=lead.op if lead else None,
        threshold=lead.value if lead else None,
    )


@dataclass(frozen=True)
class Span:
    """A time a finding of the charted rule was ``pending`` or ``firing`` (``end`` None: still)."""

    state: str
    start: datetime
    end: datetime | None


@dataclass(frozen=True)
class Mark:
    """A decision to mark on the time axis: when, a short label (``cordon``), and its detail."""

    at: datetime
    label: str
    detail: str = ""


@dataclass
class Line:
    """One series' line: its label, colour, SVG path data and latest value; ``dashed`` for a
    threshold series."""

    label: str
    color: str
    path: str
    last: float | None
    points: int
    dashed: bool = False


@dataclass
class Band:
    """A shaded stretch of the plot (SVG x from ``x0`` to ``x1``): ``pending`` or ``firing``."""

    state: str
    x0: float
    x1: float
    title: str


@dataclass
class Tick:
    """A decision marked on the plot at SVG x ``x``."""

    x: float
    label: str
    title: str


@dataclass
class Panel:
    """One chart panel, in SVG user units (``WIDTH`` x ``HEIGHT``)."""

    title: str
    unit: str
    lines: list[Line] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    x_ticks: list[tuple[float, str, str]] = field(default_factory=list)  # x, label, text-anchor
    error: str | None = None
    thresholds: list[tuple[float, str]] = field(default_factory=list)  # (y in SVG units, label)
    bands: list[Band] = field(default_factory=list)
    marks: list[Tick] = field(default_factory=list)
    source: str = ""  # the PromQL charted (the rule's input series for the node)
    threshold_source: str = ""  # the PromQL of the threshold series, when the rule compares two series
    rule: str = ""  # the rule charted; "" for the default panels
    condition: str = ""  # the rule's test, in words: "> 78", "below the threshold series"
    filters: tuple[str, ...] = ()  # the rule's and/unless conditions, taken off the chart


@dataclass
class Chart:
    """The chart of one node over ``[start, end]``; ``error`` set when no panel could be drawn."""

    start: datetime
    end: datetime
    panels: list[Panel]
    width: int = WIDTH
    height: int = HEIGHT
    error: str | None = None
    margin_left: int = MARGIN_LEFT
    margin_right: int = MARGIN_RIGHT
    margin_top: int = MARGIN_TOP
    plot_bottom: int = HEIGHT - MARGIN_BOTTOM


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


@dataclass(frozen=True)
class RuleContext:
    """The rule to chart on a node page and what the page knows of it: the labels of its latest
    finding on the node (which label names the node), its pending/firing spans and the incident's
    decisions."""

    rule: Rule
    finding_labels: Mapping[str, object] = field(default_factory=dict)
    spans: tuple[Span, ...] = ()
    marks: tuple[Mark, ...] = ()


def build_chart(
    source: PrometheusRange,
    *,
    node: str,
    node_labels: tuple[str, ...],
    start: datetime,
    end: datetime,
    rule: RuleContext | None = None,
) -> Chart:
    """Query the input series of ``rule`` (or, without one, each of :data:`METRICS`) for ``node``
    over the window and lay out the panels. Never raises for a failed source: the panel carries
    the error for the page to show."""
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


def build_node_chart(
    source: PrometheusRange,
    *,
    node: str,
    node_labels: tuple[str, ...],
    start: datetime,
    end: datetime,
    rules: Sequence[RuleContext],
) -> Chart:
    """One panel per rule in ``rules`` (:func:`build_chart` for each); the default panels when
    ``rules`` is empty. ``error`` is set only when every panel failed."""
    if not rules:
        return build_chart(source, node=node, node_labels=node_labels, start=start, end=end)
    step = step_for(start, end)
    panels = [
        _rule_panel(source, r, node=node, node_labels=node_labels, start=start, end=end, step=step)
        for r in rules
    ]
    errors = [p.error for p in panels if p.error]
    return Chart(start=start, end=end, panels=panels, error=errors[0] if len(errors) == len(panels) else None)


def chart_query(rule: Rule, *, node: str, finding_labels: Mapping[str, object] | None = None) -> RuleQuery:
    """The rule's input series and threshold narrowed to ``node`` (by the label its finding
    carries; the rule's first node label without one). Raises :class:`PromqlSyntax`."""
    matchers = node_matchers(finding_labels, node, rule.node_labels)
    return rule_query(rule.expr, matchers)


def _rule_panel(
    source: PrometheusRange,
    ctx: RuleContext,
    *,
    node: str,
    node_labels: tuple[str, ...],
    start: datetime,
    end: datetime,
    step: float,
) -> Panel:
    """The rule's input series for ``node`` (one query narrowed to the node, not the fleet's),
    its threshold lines or series, its pending and firing spans and the incident's decisions."""
    rule = ctx.rule
    title = f"{rule.name}: {rule.unit}" if rule.unit else rule.name
    unit = rule.unit or "value"
    try:
        what = chart_query(rule, node=node, finding_labels=ctx.finding_labels)
    except PromqlSyntax as exc:
        return Panel(title=title, unit=unit, error=f"cannot chart this rule: {exc}", rule=rule.name)
    if what.threshold_series:
        condition = "compared with the dashed series"
    else:
        condition = " and ".join(str(b) for b in what.bounds)  # "": a bitmask or no-data rule
    base = Panel(
        title=title,
        unit=unit,
        source=what.series,
        threshold_source=what.threshold_series or "",
        rule=rule.name,
        condition=condition,
        filters=what.filters,
    )
    try:
        found = source.query_range(what.series, start=start, end=end, step_seconds=step)
        against = (
            source.query_range(what.threshold_series, start=start, end=end, step_seconds=step)
            if what.threshold_series
            else []
        )
    except SourceError as exc:
        base.error = redact_text(str(exc))
        return base
    metric = ChartMetric(what.series, title, unit)
    panel = _panel(
        metric,
        found,
        start=start,
        end=end,
        thresholds=[b.value for b in what.drawn],
        threshold_series=against,
        spans=ctx.spans,
        marks=ctx.marks,
    )
    for attr in ("source", "threshold_source", "rule", "condition", "filters"):
        setattr(panel, attr, getattr(base, attr))
    if panel.error is None:
        panel.thresholds = [(y, str(b)) for (y, _), b in zip(panel.thresholds, what.drawn, strict=True)]
    return panel


def _series_label(labels: Mapping[str, str]) -> str:
    gpu = labels.get("gpu")
    if gpu is not None:
        return f"GPU {gpu}"
    if labels.get("device"):
        port = f" port {labels['port']}" if labels.get("port") else ""
        return f"{labels['device']}{port}"
    if labels.get("counter"):
        return labels["counter"]
    return labels.get("UUID", "node")


def _series_labels(all_labels: Sequence[Mapping[str, str]]) -> list[str]:
    """Each series' legend label; series that would share one (a GPU's Xid gauge per code, two
    exporters' copies) also name the labels that tell them apart (``GPU 5 xid=79``)."""
    labels = [_series_label(one) for one in all_labels]
    for label in set(labels):
        same = [i for i, other in enumerate(labels) if other == label]
        if len(same) < 2:
            continue
        keys = sorted({k for i in same for k in all_labels[i]})
        differ = [k for k in keys if len({all_labels[i].get(k) for i in same}) > 1]
        for i in same:
            extra = " ".join(f"{k}={all_labels[i].get(k, '')}" for k in differ[:2])
            labels[i] = f"{label} {extra}".rstrip()
    return labels


def _time_label(ts: float, span: float, start: datetime) -> str:
    return datetime.fromtimestamp(ts, tz=start.tzinfo).strftime("%H:%M" if span >= 600 else "%H:%M:%S")


def _panel(
    metric: ChartMetric,
    series: list[RangeSeries],
    *,
    start: datetime,
    end: datetime,
    thresholds: Sequence[float] = (),
    threshold_series: Sequence[RangeSeries] = (),
    spans: Sequence[Span] = (),
    marks: Sequence[Mark] = (),
) -> Panel:
    panel = Panel(title=metric.title, unit=metric.unit)
    series = [s for s in series if s.points]
    against = [s for s in threshold_series if s.points]
    if not series:
        panel.error = "no samples in this window"
        return panel
    series.sort(key=lambda s: _sort_key(s.labels))
    values = [v * metric.scale for s in [*series, *against] for _, v in s.points]
    values.extend(thresholds)  # the threshold lines stay inside the plot
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
        return MARGIN_LEFT + (min(max(ts, t0), t1) - t0) / span * plot_w

    def y(value: float) -> float:
        return MARGIN_TOP + (1 - (value - lo) / (hi - lo)) * plot_h

    def line(s: RangeSeries, color: str, label: str, *, dashed: bool = False) -> Line:
        coords = [(x(ts), y(v * metric.scale)) for ts, v in s.points]
        path = "M" + " L".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords)
        if len(coords) == 1:
            path += " h2"  # a single sample still shows as a dash
        last = s.points[-1][1] * metric.scale
        return Line(label=label, color=color, path=path, last=last, points=len(coords), dashed=dashed)

    for i, (s, label) in enumerate(zip(series, _series_labels([s.labels for s in series]), strict=True)):
        panel.lines.append(line(s, PALETTE[i % len(PALETTE)], label))
    for s in against:
        panel.lines.append(line(s, THRESHOLD_COLOR, f"threshold ({_series_label(s.labels)})", dashed=True))
    panel.thresholds = [(y(v), f"{v:g}") for v in thresholds]
    for sp in spans:
        lo_ts, hi_ts = sp.start.timestamp(), (sp.end or end).timestamp()
        if hi_ts < t0 or lo_ts > t1:
            continue
        until = sp.end.strftime("%H:%M:%S") if sp.end else "now"
        title = f"{sp.state} {sp.start:%H:%M:%S} to {until}"
        panel.bands.append(Band(state=sp.state, x0=x(lo_ts), x1=x(hi_ts), title=title))
    for mk in marks:
        if t0 <= mk.at.timestamp() <= t1:
            title = f"{mk.at:%H:%M:%S} {mk.label}{': ' + mk.detail if mk.detail else ''}"
            panel.marks.append(Tick(x=x(mk.at.timestamp()), label=mk.label, title=title))
    panel.y_ticks = [(y(v), f"{v:.3g}") for v in (lo + (hi - lo) * k / 4 for k in range(5))]
    # The first label starts at the axis and the last ends at the plot's edge, so none is cut.
    anchors = ("start", "middle", "middle", "middle", "end")
    panel.x_ticks = [
        (x(t0 + span * k / 4), _time_label(t0 + span * k / 4, span, start), anchors[k]) for k in range(5)
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
