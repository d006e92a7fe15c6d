"""The Xid catalog (rules/catalog/xid-catalog.yaml) and the default pack's Xid rules agree.

The rules carry the code lists as PromQL; when the catalog changes, this test fails and prints the
fragment to paste into rules/gpu-errors.yaml.
"""

from __future__ import annotations

import re

import pytest

from healer.ruleset.inputs import NVLINK5_ERROR_METRICS, input_metrics
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import Rule
from healer.ruleset.xid_catalog import (
    ACTIONABLE,
    XidCatalog,
    load_xid_catalog,
    render_label_regex,
    render_value_match,
)
from tests.conftest import REPO

XID = "DCGM_FI_DEV_XID_ERRORS"


@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return load_xid_catalog(REPO / "rules" / "catalog" / "xid-catalog.yaml")


@pytest.fixture(scope="module")
def rules() -> dict[str, Rule]:
    return {r.name: r for r in load_ruleset([REPO / "rules"]).rules}


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def codes_in(expr: str) -> set[int]:
    """Every Xid code the expression keeps of the Xid gauge: ``== N``, and ``>= A <= B`` spans
    minus the ``!= N`` filters chained after them (``render_value_match``)."""
    flat_expr = flat(expr)
    codes = {int(c) for c in re.findall(rf"{XID} == (\d+)", flat_expr)}
    for lo, hi, gaps in re.findall(rf"{XID} >= (\d+) <= (\d+)((?: != \d+)*)", flat_expr):
        codes.update(set(range(int(lo), int(hi) + 1)) - {int(n) for n in re.findall(r"\d+", gaps)})
    return codes


def assert_carries(rule: Rule, fragment: str) -> None:
    assert flat(fragment) in flat(rule.expr), f"{rule.name} must carry, from the catalog:\n{fragment}"


def test_every_entry_names_its_source_and_class(catalog: XidCatalog) -> None:
    assert catalog.xids
    for entry in catalog.xids:
        assert catalog.sources[entry.source], entry.code
        assert entry.name
    # The cases the pack's behaviour rests on (NVIDIA's catalogue, NVSentinel, nvml.h).
    assert catalog.classify(79) == "reboot"
    assert catalog.classify(154) == "reboot"  # reset or reboot: field 1523 says which
    assert catalog.classify(64) == "fatal-replace"
    assert {catalog.classify(c) for c in (13, 31, 43, 45)} == {"application"}
    assert catalog.classify(999) == "unknown"
    assert catalog.codes(corroborate=True) == list(range(144, 151))


def test_fatal_xid_rules_act_on_exactly_the_actionable_classes(
    catalog: XidCatalog, rules: dict[str, Rule]
) -> None:
    codes = catalog.codes(*ACTIONABLE, corroborate=False)
    assert_carries(rules["GpuFatalXid"], render_value_match(XID, codes))
    assert_carries(rules["GpuFatalXidRecent"], f'xid=~"{render_label_regex(codes)}"')
    # Exactly those codes: nothing the catalog calls an application fault or wants corroborated.
    assert codes_in(rules["GpuFatalXid"].expr) == set(codes)
    assert not codes_in(rules["GpuFatalXid"].expr) & set(catalog.codes("application"))


def test_nvlink5_xids_need_corroboration(catalog: XidCatalog, rules: dict[str, Rule]) -> None:
    codes = catalog.codes(corroborate=True)
    rule = rules["GpuNvlink5XidCorroborated"]
    assert_carries(rule, render_value_match(XID, codes))
    assert_carries(rule, f'xid=~"{render_label_regex(codes)}"')
    assert " and on (" in flat(rule.expr) and ">= 2" in rule.expr
    assert "NVLINK_RECOVERY_ERROR_COUNT_TOTAL" in rule.expr


def test_the_nvlink5_xid_rule_stays_quiet_exactly_where_the_nvlink_counter_rules_judge(
    rules: dict[str, Rule],
) -> None:
    # One fault, one finding: the Xid rule's `unless` lists exactly the counters of the rules that
    # already report the GPU (a counter added there and not here would judge one fault twice).
    xid_rule = rules["GpuNvlink5XidCorroborated"].expr
    exceptions = set(re.findall(r"DCGM_FI_DEV_NVLINK_[A-Z0-9_]+", xid_rule.rsplit("unless on", 1)[1]))
    judged = input_metrics(rules["NvlinkRecoveryErrors"].expr) | input_metrics(
        rules["Nvlink5LinkErrors"].expr
    )
    assert exceptions == judged
    # and the NVLink5 counters are those the exporter check knows only Blackwell GPUs report
    assert set(NVLINK5_ERROR_METRICS) == input_metrics(rules["Nvlink5LinkErrors"].expr) - {
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
    }


def test_unknown_xid_is_every_code_the_catalog_does_not_list(
    catalog: XidCatalog, rules: dict[str, Rule]
) -> None:
    rule = rules["GpuUnknownXid"]
    assert_carries(rule, f"{XID} > 0 unless ( {render_value_match(XID, catalog.codes())} )")
    assert codes_in(rule.expr) == set(catalog.codes())
    assert rule.severity == "warning"
    assert {a.kind for a in rule.actions} == {"taint", "ticket"}


def test_no_xid_rule_depends_on_the_no_error_series(rules: dict[str, Rule]) -> None:
    # dcgm-exporter 4.4.1+ emits no Xid series until the first Xid: err_code="0" never shows there.
    for rule in rules.values():
        if XID in rule.expr:
            assert 'err_code="0"' not in rule.expr and "== 0" not in rule.expr, rule.name


def test_value_match_joins_runs() -> None:
    # One selection of the gauge: the span of the codes, minus each integer in it that is not one.
    assert render_value_match("m", [46, 48, 62, 63, 64]) == "m >= 46 <= 64 != 47 " + " ".join(
        f"!= {n}" for n in range(49, 62)
    )
    assert render_value_match("m", [144, 145, 146]) == "m >= 144 <= 146"
    assert render_value_match("m", [79]) == "m == 79"
    assert render_label_regex([150, 144]) == "144|150"
