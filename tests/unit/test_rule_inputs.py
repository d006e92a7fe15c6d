"""Which metrics a rule reads and which it cannot do without (healer.ruleset.inputs), and the
counters CSV lines that add a dcgm-exporter field (healer.ruleset.counters)."""

from __future__ import annotations

from pathlib import Path

import pytest

from healer.ruleset.counters import read_counters
from healer.ruleset.inputs import (
    HARDWARE_METRICS,
    NVLINK5_ERROR_METRICS,
    Input,
    PromqlSyntax,
    check_rule,
    inputs,
    missing_inputs,
    optional_absent,
    presence_query,
)
from healer.ruleset.loading import load_ruleset

REPO = Path(__file__).resolve().parents[2]


def names(found: list[Input]) -> list[str]:
    return [str(i) for i in found]


@pytest.mark.parametrize(
    ("expr", "present", "missing"),
    [
        ("a > 1", set(), ["a"]),
        ("a > 1", {"a"}, []),
        ("a or b", {"b"}, []),
        ("a or b", set(), ["a", "b"]),
        ("a unless b", {"a"}, []),
        ("a * on (x) group_left () b", {"a"}, ["b"]),
        ("a and on (x) b", {"a"}, ["b"]),
        ("a + ignoring (y) b", {"b"}, ["a"]),
        ("absent(a)", set(), []),
        ('{__name__=~"a|b"} > 0', {"b"}, []),
        ('{__name__=~"a|b"} > 0', set(), ["a or b"]),
        ('{__name__="a"}', set(), ["a"]),
        ('{__name__=~"a.*"}', set(), []),  # a general regex cannot be checked
        ("sum by (node) (rate(a[5m]))", set(), ["a"]),
        ("sum(rate(a[5m])) by (node) / count without (gpu) (b)", {"a"}, ["b"]),
        ("max_over_time((count by (n) (a))[1h:1m]) - a offset -5m", set(), ["a"]),
        ("a @ start() ^ 2 ^ b", {"a", "b"}, []),
        (
            'label_replace(a >= 65535, "counter", "x", "", "") or label_replace(b, "c", "y", "", "")',
            {"b"},
            [],
        ),
        ("quantile(0.5, a) < bool 1e3", set(), ["a"]),
        ("-a * Inf + Info_metric", {"a"}, ["Info_metric"]),
        ("a # a comment naming b\n + 0x1f", {"a"}, []),
        ("topk(3, a) > on () vector(1)", {"a"}, []),
        ("time() - a offset 1h30m", set(), ["a"]),
    ],
)
def test_what_an_expression_cannot_do_without(expr: str, present: set[str], missing: list[str]) -> None:
    assert names(missing_inputs(expr, present)) == missing


def test_optional_inputs_are_the_fallbacks_and_exceptions() -> None:
    assert names(optional_absent("a unless b", {"a"})) == ["b"]
    assert names(optional_absent("(a or c) > 1", {"c"})) == ["a"]
    assert names(optional_absent("a unless b", set())) == ["b"]  # a is required: not optional


def test_unreadable_text_is_an_error() -> None:
    with pytest.raises(PromqlSyntax):
        inputs("sum(a")
    with pytest.raises(PromqlSyntax):
        inputs("a $ b")


def test_the_default_pack() -> None:
    """Every default rule's expression is read; with only temperatures exported, the thermal rules
    see their inputs (the margin field is their fallback) and the clock-event rules do not."""
    rules = {r.name: r for r in load_ruleset([REPO / "rules"], promtool=False).rules}
    for rule in rules.values():
        assert inputs(rule.expr), rule.name
    present = {"DCGM_FI_DEV_GPU_TEMP"}
    hot = check_rule("GpuTooHot", rules["GpuTooHot"].expr, present)
    assert (hot.blind, names(hot.optional)) == (
        False,
        ["DCGM_FI_DEV_GPU_TEMP_LIMIT or DCGM_FI_DEV_GPU_TEMP_MARGIN_CELSIUS"],
    )
    slowdown = check_rule("GpuHardwareSlowdown", rules["GpuHardwareSlowdown"].expr, present)
    assert names(slowdown.required) == [
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    ]
    xid = check_rule("GpuFatalXid", rules["GpuFatalXid"].expr, present)
    assert (xid.blind, names(xid.events)) == (False, ["DCGM_FI_DEV_XID_ERRORS"])
    # A Hopper fleet has no NVLink5 counters: the NVLink5 rule is not blind, its inputs are
    # hardware-only (the NVLink5 Xid rule judges those GPUs instead).
    nvlink5 = check_rule("Nvlink5LinkErrors", rules["Nvlink5LinkErrors"].expr, present)
    assert not nvlink5.blind and not nvlink5.required
    assert {n for i in nvlink5.hardware for n in i.names} == set(NVLINK5_ERROR_METRICS)
    assert all(HARDWARE_METRICS[n] == "NVLink5 (Blackwell) GPUs only" for n in NVLINK5_ERROR_METRICS)
    with_them = check_rule(
        "Nvlink5LinkErrors", rules["Nvlink5LinkErrors"].expr, present | {NVLINK5_ERROR_METRICS[0]}
    )
    assert (with_them.hardware, with_them.required) == ([], [])
    query = presence_query([r.expr for r in rules.values()])
    assert query.startswith('group by (__name__) ({__name__=~"DCGM_EXP_XID_ERRORS_COUNT|')


def test_counters_csv_lines() -> None:
    lines = read_counters(REPO / "deploy" / "dcgm-exporter")
    (new,) = lines["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]
    (old,) = lines["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]
    assert (new.file, old.file) == ("counters-4.x.csv", "counters-3.x.csv")
    assert str(new).endswith(
        ": DCGM_FI_DEV_CLOCKS_EVENT_REASONS, gauge, Current clock event reasons (bitmask)."
    )
    (recovery,) = lines["DCGM_FI_DEV_GPU_RECOVERY_ACTION"]
    assert recovery.commented and "(commented out: uncomment it)" in str(recovery)
    assert {line.file for line in lines["DCGM_FI_DEV_GPU_TEMP"]} == {"counters-3.x.csv", "counters-4.x.csv"}
