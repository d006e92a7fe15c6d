"""Blind spots judged from query answers (pure): which rule cannot see which GPU, port or node.

The answers are what the queries of :mod:`healer.blind_spots` return; the real Prometheus runs
them in tests/integration/test_blind_spots_prometheus.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from healer.blind_spots import DCGM, INFINIBAND, Answers, judge, lacking_query, plans, presence_of
from healer.model.addresses import build_address_book
from healer.model.blind_spots import MAX_STORED_SPOTS, WHOLE_NODE, BlindReport
from healer.ruleset.inputs import Input
from healer.ruleset.loading import load_ruleset

PACK = load_ruleset([Path(__file__).resolve().parents[2] / "rules"], promtool=False)
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
TEMP = Input(("DCGM_FI_DEV_GPU_TEMP",))
LINK_DOWNED = Input(("node_infiniband_link_downed_total",))


def plan_index(family: str, i: Input) -> int:
    return next(n for n, p in enumerate(plans(PACK)) if p.family.name == family and i in p.inputs)


def everything_present() -> set[str]:
    return {n for p in plans(PACK) for n in p.listing}


def gpu(node: str, index: int, **extra: str) -> dict[str, str]:
    return {"Hostname": node, "instance": f"{node}:9400", "gpu": str(index), **extra}


def test_a_gpu_without_temperature_is_blind_for_every_rule_that_needs_it() -> None:
    answers = Answers(
        present=everything_present(),
        lacking={(plan_index(DCGM.name, TEMP), TEMP): [gpu("gpu-vgpu", 0), gpu("gpu-vgpu", 1)]},
    )
    report = judge(ruleset=PACK, answers=answers, now=NOW)
    rules = {s.rule for s in report.spots}
    # The thermal rules and those counting GPUs by their temperature series cannot see it ...
    assert {"GpuTooHot", "GpuMissing", "DcgmExporterSilent"} <= rules
    # ... the Xid and InfiniBand rules can.
    assert not rules & {"GpuFatalXid", "InfinibandLinkDowned"}
    hot = [s for s in report.spots if s.rule == "GpuTooHot"]
    assert [(s.node, s.scope, s.missing) for s in hot] == [
        ("gpu-vgpu", "gpu 0", ("DCGM_FI_DEV_GPU_TEMP",)),
        ("gpu-vgpu", "gpu 1", ("DCGM_FI_DEV_GPU_TEMP",)),
    ]
    assert report.counts()[("GpuTooHot", "gpu-vgpu")] == 2


def test_an_input_no_target_exports_is_the_fleets_gap_not_a_nodes() -> None:
    present = everything_present() - {"DCGM_FI_DEV_GPU_TEMP"}
    answers = Answers(present=present, lacking={})
    assert judge(ruleset=PACK, answers=answers, now=NOW).spots == ()


def test_a_fallback_input_is_not_needed() -> None:
    """GpuTooHot reads the thermal limit only as an exception list (``unless``): lacking it is
    no blind spot for that rule."""
    limit = Input(("DCGM_FI_DEV_GPU_TEMP_LIMIT", "DCGM_FI_DEV_GPU_TEMP_MARGIN_CELSIUS"))
    answers = Answers(
        present=everything_present(), lacking={(plan_index(DCGM.name, limit), limit): [gpu("n", 0)]}
    )
    rules = {s.rule for s in judge(ruleset=PACK, answers=answers, now=NOW).spots}
    assert "GpuTooHot" not in rules


def test_an_unreadable_counter_blinds_only_the_rule_reading_it_on_that_port() -> None:
    port = {"node": "ib-node", "instance": "10.0.0.5:9100", "device": "mlx5_0", "port": "1"}
    answers = Answers(
        present=everything_present(),
        lacking={(plan_index(INFINIBAND.name, LINK_DOWNED), LINK_DOWNED): [port]},
    )
    report = judge(ruleset=PACK, answers=answers, now=NOW)
    assert [(s.node, s.rule, s.scope) for s in report.spots] == [
        ("ib-node", "InfinibandLinkDowned", "mlx5_0 port 1")
    ]


def test_series_naming_no_node_are_listed_not_counted() -> None:
    book = build_address_book(
        nodes=[("gpu-a", ["10.0.0.1"])],
        pods=[("gpu-a", ["10.1.0.7"])],
        pod_names=[("dcgm-exporter-abcde", "gpu-a")],
    )
    answers = Answers(
        present=everything_present(),
        lacking={
            (plan_index(DCGM.name, TEMP), TEMP): [
                {
                    "Hostname": "dcgm-exporter-abcde",
                    "instance": "10.1.0.7:9400",
                    "gpu": "0",
                },  # a pod: its node
                {"Hostname": "dcgm-exporter-wwwjh", "instance": "10.9.9.9:9400", "gpu": "0"},  # nothing
            ]
        },
    )
    report = judge(ruleset=PACK, answers=answers, now=NOW, book=book)
    assert {s.node for s in report.spots} == {"gpu-a"}
    (unresolved,) = report.unresolved
    assert "dcgm-exporter-wwwjh" in unresolved.series and "names no Node" in unresolved.why


def test_a_gpu_node_without_any_dcgm_series_is_blind_as_a_whole() -> None:
    reporting = {plan_index(DCGM.name, TEMP): [gpu("gpu-a", 0)]}
    answers = Answers(present=everything_present(), reporting=reporting)
    report = judge(ruleset=PACK, answers=answers, now=NOW, gpu_nodes=["gpu-a", "gpu-silent"])
    assert {s.node for s in report.spots} == {"gpu-silent"}
    assert {s.scope for s in report.spots} == {WHOLE_NODE}
    assert "GpuTooHot" in {s.rule for s in report.spots}
    assert "InfinibandLinkDowned" not in {s.rule for s in report.spots}


def test_the_report_survives_its_switch() -> None:
    answers = Answers(
        present=everything_present(),
        lacking={(plan_index(DCGM.name, TEMP), TEMP): [gpu("gpu-vgpu", 0)]},
        errors=["node_infiniband_symbol_error_total: timeout"],
    )
    report = judge(ruleset=PACK, answers=answers, now=NOW)
    assert BlindReport.from_switch(report.as_switch()) == report
    assert BlindReport.from_switch({}) is None


def test_the_queries_compare_like_with_like() -> None:
    dcgm = plans(PACK)[plan_index(DCGM.name, TEMP)]
    query = lacking_query(dcgm, TEMP)
    # dcgm-exporter: two exporters of one node are one node's (no instance in the match) ...
    assert "unless on (Hostname, hostname, node, kubernetes_node, nodename, gpu)" in query
    ib = plans(PACK)[plan_index(INFINIBAND.name, LINK_DOWNED)]
    # ... node_exporter's address may be all that names its node.
    assert "unless on (node, kubernetes_node, nodename, instance, device, port)" in lacking_query(
        ib, LINK_DOWNED
    )
    # Event metrics (absent until the first Xid) are never expected; node_infiniband_info has no port.
    assert "DCGM_FI_DEV_XID_ERRORS" not in presence_of(PACK)
    assert "node_infiniband_info" not in presence_of(PACK)


def test_a_large_observation_stores_the_first_spots_and_exact_counts() -> None:
    """Half a fleet lacking a field is thousands of GPUs: the switch keeps the first ones (the
    dashboard shows 50), the totals stay exact for the page and /metrics."""
    rows = [gpu(f"gpu-{n:05d}", i) for n in range(400) for i in range(8)]  # 3,200 GPUs
    answers = Answers(present=everything_present(), lacking={(plan_index(DCGM.name, TEMP), TEMP): rows})
    report = judge(ruleset=PACK, answers=answers, now=NOW)
    stored = BlindReport.from_switch(report.as_switch())
    assert stored is not None
    assert len(stored.spots) == MAX_STORED_SPOTS < report.found == stored.found
    assert stored.per_rule == report.per_rule and stored.per_rule["GpuTooHot"] == 3200
    assert stored.spots == report.spots[:MAX_STORED_SPOTS]
