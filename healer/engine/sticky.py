"""Sticky gauges: old evidence after a repair is not a new fault. Pure.

dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` holds the last Xid a GPU reported until the exporter
restarts, so a rule on it keeps firing with the same value after the GPU was repaired. For rules
marked ``sticky: true`` healer remembers, per node, the value each firing series had when the
repair was accepted (the ``repaired → validating`` step): a series still at that value is
discounted (it neither fails validation nor re-opens the node); a different value, or a series not
seen at repair time, counts as usual. An entry is forgotten once its series stops firing in a tick
that observed the rule (not frozen, node not unknown), so a later fault with the same value after
the exporter reset counts again. Rules on windowed counts (``DCGM_EXP_XID_ERRORS_COUNT``) are not
sticky: a rising count is a new value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from healer.model.findings import Finding, TickFindings

#: Per node: series key → the value seen at repair time.
Baseline = Mapping[str, float]


def _same(finding: Finding, baseline: Baseline) -> bool:
    old = baseline.get(finding.series_key)
    return old is not None and finding.value is not None and math.isclose(finding.value, old, rel_tol=1e-12)


def at_repair(firing: Iterable[Finding], sticky_rules: frozenset[str]) -> dict[str, float]:
    """The baseline to remember at repair time: each firing series of a sticky rule → its value."""
    return {
        f.series_key: f.value
        for f in firing
        if f.rule in sticky_rules and f.value is not None and math.isfinite(f.value)
    }


def discount(
    findings: Iterable[Finding], baseline: Baseline, sticky_rules: frozenset[str]
) -> tuple[Finding, ...]:
    """``findings`` without the sticky series still at their repair-time value."""
    return tuple(f for f in findings if not (f.rule in sticky_rules and _same(f, baseline)))


def prune(
    baseline: Baseline,
    found: Iterable[Finding],
    *,
    frozen_rules: frozenset[str],
    unknown: bool,
) -> dict[str, float]:
    """The baseline after a tick: entries whose series no longer fires or pends are forgotten,
    unless the tick could not see it (its rule frozen or the node without data)."""
    if unknown:
        return dict(baseline)
    present = {f.series_key for f in found}
    return {
        key: value
        for key, value in baseline.items()
        if key in present or key.split("{", 1)[0] in frozen_rules
    }


def discount_tick(
    findings: TickFindings, baselines: Mapping[str, Baseline], sticky_rules: frozenset[str]
) -> TickFindings:
    """The tick's findings with every node's repair-time sticky values discounted (the breaker's
    input must not count old evidence either)."""
    if not sticky_rules or not baselines:
        return findings

    def per_node(by_node: dict[str, list[Finding]]) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for node, found in by_node.items():
            kept = list(discount(found, baselines.get(node, {}), sticky_rules))
            if kept:
                out[node] = kept
        return out

    return replace(findings, firing=per_node(findings.firing), pending=per_node(findings.pending))
