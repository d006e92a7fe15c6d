"""Which nodes each rule's budget and circuit breaker count over: the rule's node pool (pure).

For a node ``n`` and a rule that takes nodes out of service (``quarantine`` or ``taint``), the pool
is, in order:

1. the pool the rule (or its group) names by node labels (``pool: {node_selector: ...}``): the
   nodes whose labels carry every pair, named ``pool.name`` or the rule's name;
2. when the rule's coverage is known (the nodes exporting at least one series of its input
   metrics, observed by the controller from Prometheus): the covered nodes of ``n``'s labelled
   pool. It is named after the labelled pool when the rule covers all of it (the usual dcgm
   case), else ``<labelled pool>/<metric family>`` (``default/node_infiniband``): CPU nodes, or
   GPU nodes without InfiniBand, never dilute the percentages;
3. otherwise ``n``'s labelled pool (the pool label, else ``default`` for GPU nodes and ``no-gpu``).

A node that fires a rule is covered by it (its series exist), whatever the last observation said.
A step that is not on account of a rule (or a node with no such rule firing) counts against the
node's labelled pool. The controller observes coverage and node labels and hands them in as data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from healer.model.node import DEFAULT_POOL
from healer.ruleset.inputs import family, input_metrics
from healer.ruleset.schema import RuleSet

#: How a pool's nodes were found (shown on the dashboard).
LABELS, COVERAGE, SELECTOR = "labels", "coverage", "selector"


@dataclass(frozen=True)
class Pools:
    """Every pool of one tick: its nodes, how they were found, the rules counted over it."""

    labelled: Mapping[str, str]  # node → its labelled pool
    members: Mapping[str, frozenset[str]]
    kinds: Mapping[str, str] = field(default_factory=dict)  # pool → LABELS | COVERAGE | SELECTOR
    rules: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # pool → rules counted over it
    by_rule: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # rule → labelled pool → pool
    selected: Mapping[str, str] = field(default_factory=dict)  # rule → its named pool

    def pool_for(self, rule: str, node: str) -> str:
        """The pool ``node`` counts in on ``rule``'s account."""
        if rule in self.selected:
            return self.selected[rule]
        labelled = self.labelled.get(node, DEFAULT_POOL)
        return self.by_rule.get(rule, {}).get(labelled, labelled)

    def pools_of(self, node: str, rules: Iterable[str] = ()) -> tuple[str, ...]:
        """The pools a step on ``node`` for ``rules`` counts against (its labelled pool without rules)."""
        found = sorted({self.pool_for(r, node) for r in rules})
        return tuple(found) or (self.labelled.get(node, DEFAULT_POOL),)


@lru_cache(maxsize=1024)
def _family(expr: str) -> str:
    return family(input_metrics(expr))


def removing_rules(rules: RuleSet) -> list[str]:
    """Rules whose findings take a node out of service (``quarantine`` or ``taint``)."""
    return [r.name for r in rules.rules if {a.kind for a in r.actions} & {"quarantine", "taint"}]


def build(
    *,
    rules: RuleSet,
    labelled: Mapping[str, str],
    coverage: Mapping[str, frozenset[str]] | None = None,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    firing: Mapping[str, Iterable[str]] | None = None,
) -> Pools:
    """The pools of a tick.

    Args:
        rules: the rule set (actions, named pools, expressions).
        labelled: every node of the cluster → its labelled pool (the denominators' universe).
        coverage: rule → nodes exporting its input metrics; a rule missing here (not observed yet,
            or its observation failed) counts over the labelled pools.
        node_labels: node → its Kubernetes labels, for named pools; None: not read (such rules
            count over the labelled pools).
        firing: rule → nodes it fires on this tick (covered whatever ``coverage`` says).
    """
    members: dict[str, set[str]] = {}
    kinds: dict[str, str] = {}
    counted: dict[str, set[str]] = {}
    for node, pool in labelled.items():
        members.setdefault(pool, set()).add(node)
        kinds[pool] = LABELS
    named = rules.pools()
    selected: dict[str, str] = {}
    by_rule: dict[str, dict[str, str]] = {}
    firing = firing or {}
    for rule in removing_rules(rules):
        fired = set(firing.get(rule, ())) & labelled.keys()
        spec = named.get(rule)
        if spec is not None and node_labels is not None:
            name = spec.name or rule
            chosen = {
                n
                for n in labelled
                if all(node_labels.get(n, {}).get(k) == v for k, v in spec.node_selector.items())
            }
            if kinds.get(name) == LABELS and members[name] != chosen | fired:
                name = f"{name}/selector"  # never widen a labelled pool of the same name
            members[name] = members.get(name, set()) | chosen | fired
            kinds[name] = SELECTOR
            selected[rule] = name
            counted.setdefault(name, set()).add(rule)
            continue
        if coverage is None or rule not in coverage:
            for lp in set(labelled.values()):
                counted.setdefault(lp, set()).add(rule)
            continue
        covered = (set(coverage[rule]) & labelled.keys()) | fired
        per_pool: dict[str, set[str]] = {}
        for n in covered:
            per_pool.setdefault(labelled[n], set()).add(n)
        by_rule[rule] = {}
        for lp, nodes in per_pool.items():
            whole = nodes == members[lp] and kinds[lp] == LABELS
            name = lp if whole else f"{lp}/{_family(rules.rule(rule).expr) or rule}"
            if name != lp and name in members and members[name] != nodes:
                name = f"{lp}/{rule}"  # two rules of one family covering different nodes
            members.setdefault(name, set()).update(nodes)
            kinds.setdefault(name, COVERAGE)
            by_rule[rule][lp] = name
            counted.setdefault(name, set()).add(rule)
    return Pools(
        labelled=dict(labelled),
        members={p: frozenset(n) for p, n in members.items()},
        kinds=kinds,
        rules={p: tuple(sorted(r)) for p, r in counted.items()},
        by_rule=by_rule,
        selected=selected,
    )
