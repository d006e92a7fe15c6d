"""Shadow rules (``mode: shadow``): evaluated like any rule, kept off everything that acts. Pure.

A shadow rule's findings never reach the node lifecycle, the breaker, GPU isolation or tickets:
:func:`acting` removes them from a tick's findings. What the rule would have done is recorded
instead (:func:`would_take`, :func:`firing`; ``healer.controller.shadow``), and judged later by
what happened to the node (:func:`healer.engine.outcomes.judge_shadow`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from healer.model.findings import Finding, TickFindings
from healer.ruleset.schema import DrainAction, QuarantineAction, Rule, RuleSet, TaintAction, TicketAction


def shadow_rules(rules: RuleSet) -> frozenset[str]:
    """The names of the rules in ``mode: shadow``."""
    return frozenset(r.name for r in rules.rules if r.mode == "shadow")


def acting(findings: TickFindings, rules: RuleSet) -> TickFindings:
    """``findings`` without the shadow rules' (what everything that acts may see)."""
    shadow = shadow_rules(rules)
    if not shadow:
        return findings

    def drop(by_node: dict[str, list[Finding]]) -> dict[str, list[Finding]]:
        out = {}
        for node, found in by_node.items():
            rest = [f for f in found if f.rule not in shadow]
            if rest:
                out[node] = rest
        return out

    return replace(findings, firing=drop(findings.firing), pending=drop(findings.pending))


def would_take(rule: Rule) -> list[str]:
    """The actions ``rule`` would take on a node it fires on: ``cordon`` (a node-scoped quarantine),
    ``isolate_gpu`` (a GPU-scoped one), ``taint``, ``drain``, ``ticket`` (its ticket action or a
    ladder step asking one)."""
    out: list[str] = []
    for a in rule.actions:
        if isinstance(a, QuarantineAction):
            out.append("isolate_gpu" if a.scope == "gpu" else "cordon")
        elif isinstance(a, TaintAction):
            out.append("taint")
        elif isinstance(a, DrainAction):
            out.append("drain")
        elif isinstance(a, TicketAction):
            out.append("ticket")
    if rule.ladder and any(getattr(s, "kind", None) == "ticket" for s in rule.ladder):
        out.append("ticket")
    return list(dict.fromkeys(out))


def firing(findings: TickFindings, rules: RuleSet) -> dict[str, dict[str, dict[str, Any]]]:
    """shadow rule → node → evidence of its first firing finding there (JSON-safe: rule, GPU, value,
    unit, labels, since, summary)."""
    shadow = shadow_rules(rules)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for node, found in findings.firing.items():
        for f in found:
            if f.rule in shadow and node not in out.get(f.rule, {}):
                out.setdefault(f.rule, {})[node] = {**f.evidence, "summary": f.summary}
    return out
