"""One GPU out instead of eight: which findings stay at the GPU and which escalate to the node. Pure.

A rule whose quarantine says ``scope: gpu`` asks healer to take out only the GPU its finding names
(a DRA ``DeviceTaintRule``, or a node annotation; :mod:`healer.actions.gpu_isolation`) and keep the
node serving with the rest. Per node, its findings (firing or pending) of such rules are
**contained** (kept off the node lifecycle, so the node stays healthy and schedulable) while:

* they all name a GPU (a finding without one is about the node or its fabric: NVLink switch,
  InfiniBand), and
* they name one GPU only; a second bad GPU on the node means the node itself is suspect
  (shared power, baseboard, NVSwitch), and
* no other rule that remediates (quarantine or taint) fires on the node (a fabric finding of
  another rule takes the node out anyway).

Otherwise nothing is contained and the node goes the usual way (suspect → quarantined → drained),
under its strongest rule. The GPUs to take out are the firing ``scope: gpu`` findings with a GPU,
contained or not: a node escalated keeps its GPU taints until each finding resolves.
"""

from __future__ import annotations

from dataclasses import replace

from healer.model.findings import Finding, TickFindings
from healer.ruleset.schema import QuarantineAction, Rule, RuleSet, TaintAction


def _rule(rules: RuleSet, name: str) -> Rule | None:
    try:
        return rules.rule(name)
    except KeyError:
        return None


def gpu_scoped(rule: Rule | None) -> bool:
    """The rule quarantines with ``scope: gpu``."""
    return rule is not None and any(
        isinstance(a, QuarantineAction) and a.scope == "gpu" for a in rule.actions
    )


def _remediates(rule: Rule | None) -> bool:
    return rule is not None and any(isinstance(a, QuarantineAction | TaintAction) for a in rule.actions)


def contained(findings: TickFindings, rules: RuleSet) -> dict[str, str]:
    """node → the one GPU its ``scope: gpu`` findings are contained to (see the module docstring)."""
    out: dict[str, str] = {}
    for node in {*findings.firing, *findings.pending}:
        scoped = [f for f in findings.for_node(node) if gpu_scoped(_rule(rules, f.rule))]
        if not scoped:
            continue
        gpus = {f.gpu for f in scoped}
        if None in gpus or "" in gpus or len(gpus) != 1:
            continue
        others = [
            f
            for f in findings.firing.get(node, ())
            if not gpu_scoped(_rule(rules, f.rule)) and _remediates(_rule(rules, f.rule))
        ]
        if not others:
            out[node] = str(next(iter(gpus)))
    return out


def for_nodes(findings: TickFindings, rules: RuleSet) -> TickFindings:
    """``findings`` without the contained ones: what the node lifecycle (and the breaker) sees."""
    keep = contained(findings, rules)
    if not keep:
        return findings

    def drop(by_node: dict[str, list[Finding]]) -> dict[str, list[Finding]]:
        out = {}
        for node, found in by_node.items():
            rest = [f for f in found if node not in keep or not gpu_scoped(_rule(rules, f.rule))]
            if rest:
                out[node] = rest
        return out

    return replace(findings, firing=drop(findings.firing), pending=drop(findings.pending))


def gpus_out(findings: TickFindings, rules: RuleSet) -> dict[str, dict[str, str]]:
    """node → GPU → rule: the GPUs to take out now (firing ``scope: gpu`` findings naming a GPU;
    the first rule by name when several name the same GPU)."""
    out: dict[str, dict[str, str]] = {}
    for node, found in findings.firing.items():
        for f in sorted(found, key=lambda x: x.rule):
            if f.gpu and gpu_scoped(_rule(rules, f.rule)):
                out.setdefault(node, {}).setdefault(str(f.gpu), f.rule)
    return out
