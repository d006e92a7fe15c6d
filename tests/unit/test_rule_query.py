"""The chart's query for each default rule: its input series narrowed to one node, and its
threshold (api/rule_query.py)."""

from __future__ import annotations

from pathlib import Path

import promql_parser
import pytest

from api.links import kubectl_commands, query_links
from api.rule_query import Bound, node_matchers, rule_query
from healer.config import Settings
from healer.ruleset.inputs import PromqlSyntax
from healer.ruleset.loading import load_ruleset

REPO = Path(__file__).resolve().parents[2]
DEFAULT = load_ruleset([REPO / "rules"])
NODE = {"Hostname": "gpu-node-07"}


def test_a_filtered_rule_charts_its_input_not_its_filtered_result() -> None:
    """GpuTooHot ends in `unless ...`: the chart is every GPU's temperature, with `> 78` drawn."""
    q = rule_query(DEFAULT.rule("GpuTooHot").expr, NODE)
    assert q.series.endswith('(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-node-07"})'), q.series
    assert "> 78" not in q.series and "unless" not in q.series
    assert q.bounds == (Bound(">", 78.0),) and q.drawn == q.bounds
    assert q.filters and q.filters[0].startswith("unless on (Hostname")


def test_a_comparison_chain_inside_an_aggregation_keeps_its_bounds() -> None:
    q = rule_query(DEFAULT.rule("GpuFatalXid").expr, NODE)
    assert "!=" not in q.series and ">=" not in q.series
    assert q.drawn == (Bound(">=", 46.0), Bound("<=", 154.0))
    assert Bound("!=", 47.0) in q.bounds


def test_two_series_compared_chart_the_other_as_the_threshold() -> None:
    q = rule_query(DEFAULT.rule("GpuSilentThrottling").expr, NODE)
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in q.series and "quantile" not in q.series
    assert q.threshold_series is not None and q.threshold_series.startswith("0.5 * quantile")
    assert 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname="gpu-node-07"}' in q.threshold_series
    assert "GR_ENGINE" not in q.series  # the `and` conditions are filters, not the series
    assert len(q.filters) == 2


def _selectors(expr: str) -> list[str]:
    found: list[str] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(str(node))

    promql_parser.walk(promql_parser.parse(expr), visit, None)
    return found


@pytest.mark.parametrize("rule", [r.name for r in DEFAULT.rules])
def test_every_default_rule_gives_a_query_scoped_to_the_node(rule: str) -> None:
    """Every selector of the series (and threshold series) carries the node matcher, and both
    parse back."""
    r = DEFAULT.rule(rule)
    label = r.node_labels[0]
    q = rule_query(r.expr, {label: "gpu-node-07"})
    for expr in filter(None, (q.series, q.threshold_series)):
        selectors = _selectors(expr)
        assert selectors and all(f'{label}="gpu-node-07"' in s for s in selectors), (rule, selectors)
    # A rule with a numeric threshold keeps it; the bitmask and no-data rules may have none.
    assert (
        q.bounds
        or q.threshold_series
        or rule
        in {
            "DcgmExporterSilent",
            "InfinibandExporterSilent",
            "GpuHardwareSlowdown",
            "GpuPowerBrake",
        }
    ), rule


def test_a_quote_in_a_value_is_refused_not_queried_wrong() -> None:
    with pytest.raises(PromqlSyntax, match="quote or backslash"):
        rule_query("up > 0", {"Hostname": 'evil"} or up{x="'})


def test_the_node_label_comes_from_the_finding() -> None:
    labels = ("Hostname", "hostname", "node")
    assert node_matchers({"hostname": "n1", "gpu": "0"}, "n1", labels) == {"hostname": "n1"}
    assert node_matchers({"instance": "10.0.0.7:9100"}, "n1", ("node",)) == {"instance": "10.0.0.7:9100"}
    assert node_matchers({}, "n1", labels) == {"Hostname": "n1"}


def test_links_never_carry_the_prometheus_credentials() -> None:
    from datetime import UTC, datetime, timedelta

    end = datetime(2026, 1, 1, 3, 0, tzinfo=UTC)
    plain = Settings(prometheus={"url": "http://prom:9090"})
    links = query_links(plain, "up", start=end - timedelta(minutes=30), end=end)
    assert links.prometheus is not None and links.prometheus.startswith("http://prom:9090/graph?g0.expr=up")
    assert "g0.range_input=30m" in links.prometheus and links.grafana is None
    secret = Settings(prometheus={"url": "http://user:pw@prom:9090"})
    assert query_links(secret, "up", start=end, end=end).prometheus is None
    grafana = Settings(api={"grafana_url": "https://grafana.example/", "grafana_datasource": "prom"})
    link = query_links(grafana, "up", start=end, end=end).grafana
    assert link is not None and link.startswith("https://grafana.example/explore?left=")
    assert kubectl_commands("gpu-node-07")[0] == "kubectl describe node gpu-node-07"


def test_the_verdict_reads_the_one_bound_of_a_default_rule() -> None:
    """The verdict's "(threshold > 78)" comes from the same split, past the rule's `unless`."""
    from api.charts import rule_series

    hot = rule_series(DEFAULT.rule("GpuTooHot"))
    assert (hot.op, hot.threshold) == (">", 78.0)
    # A set of Xid codes (">= 46 and <= 154 and != 47 ...") has no one threshold: none is named.
    xid = rule_series(DEFAULT.rule("GpuFatalXid"))
    assert (xid.op, xid.threshold) == (None, None)
    slow = rule_series(DEFAULT.rule("GpuHardwareSlowdown"))
    assert (slow.op, slow.threshold) == (None, None)


def test_a_legend_tells_apart_series_of_one_gpu() -> None:
    """A GPU's Xid gauge per code (or two exporters' copies) would read "GPU 5" twice in the legend:
    the labels that differ are named; a GPU with one series keeps its plain label."""
    from datetime import UTC, datetime

    from api.charts import ChartMetric, _panel
    from healer.sources.prometheus_range import RangeSeries

    at = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    points = [(at.timestamp() - 60, 1.0), (at.timestamp(), 1.0)]
    series = [
        RangeSeries({"gpu": "5", "xid": "79", "Hostname": "gpu-node-12"}, points),
        RangeSeries({"gpu": "5", "xid": "48", "Hostname": "gpu-node-12"}, points),
        RangeSeries({"gpu": "2", "Hostname": "gpu-node-12"}, points),
    ]
    metric = ChartMetric("DCGM_FI_DEV_XID_ERRORS", title="Xid", unit="")
    panel = _panel(metric, series, start=at.replace(hour=11), end=at)
    assert sorted(line.label for line in panel.lines) == ["GPU 2", "GPU 5 xid=48", "GPU 5 xid=79"]
