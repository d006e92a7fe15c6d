"""Fleet-wide facts derived from one tick's findings, pure: which nodes turned bad (the circuit
breaker's input) and the order nodes are reconciled in (first come, first served for the budget).

Shared by the controller (``healer.controller.fleet``) and the backtest replay
(``healer.engine.replay``), so both judge the breaker and the budget the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from healer.model.findings import TickFindings
from healer.model.states import OUT_OF_SERVICE
from healer.ruleset.schema import RuleSet


def turned_bad_on(findings: TickFindings, rules: RuleSet) -> dict[str, dict[str, datetime]]:
    """node → rule → when that quarantining rule's earliest finding on the node fired.

    Findings of frozen rules, unknown nodes and rules not in the rule set are left out: no data and
    stale state never trip the breaker.
    """
    names = {r.name: r for r in rules.rules}
    out: dict[str, dict[str, datetime]] = {}
    for node, found in findings.firing.items():
        if node in findings.unknown:
            continue
        for f in found:
            rule = names.get(f.rule)
            if rule is None or f.rule in findings.frozen_rules:
                continue
            if not {a.kind for a in rule.actions} & {"quarantine", "taint"}:
                continue
            at = f.fired_at or findings.at
            per_rule = out.setdefault(node, {})
            if f.rule not in per_rule or at < per_rule[f.rule]:
                per_rule[f.rule] = at
    return out


def turned_bad(findings: TickFindings, rules: RuleSet) -> dict[str, datetime]:
    """node → when its earliest quarantining finding fired (the circuit breaker's input); see
    :func:`turned_bad_on`."""
    return {node: min(per_rule.values()) for node, per_rule in turned_bad_on(findings, rules).items()}


def order(names: Iterable[str], findings: TickFindings, states: Mapping[str, str]) -> list[str]:
    """Nodes healer already holds first (their steps need no budget), then new ones by when their
    finding fired (first come, first served for the budget), then by name."""

    def key(name: str) -> tuple[object, ...]:
        held = states.get(name) in OUT_OF_SERVICE
        fired = min(
            ((f.fired_at or findings.at) for f in findings.firing.get(name, ())),
            default=findings.at,
        )
        return (not held, fired, name)

    return sorted(names, key=key)
