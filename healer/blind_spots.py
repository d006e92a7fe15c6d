"""Observing blind spots: which rules cannot see which GPU, InfiniBand port or node.

A rule finds nothing where its inputs are missing, and nothing must not read as health: a vGPU
guest that exports no ``DCGM_FI_DEV_GPU_TEMP`` is never too hot; a node whose dcgm-exporter
renamed a field stays quiet; node_exporter drops an InfiniBand counter whose sysfs file it cannot
read (the other counters and ``node_scrape_collector_success{collector="infiniband"} 1`` stay:
checked on node_exporter 1.5, the Debian bookworm package), so that port's errors are never
counted. This module finds those places; :mod:`healer.model.blind_spots` holds the result.

What is compared, per exporter family (:data:`FAMILIES`; other metrics, ``up`` or
kube-state-metrics, are not judged):

- dcgm-exporter (``DCGM_*``), per GPU (the ``gpu`` label);
- node_exporter's InfiniBand collector (``node_infiniband_*`` except ``node_infiniband_info``,
  which has no port), per HCA port (``device``, ``port``).

A scope (a GPU, a port) is *listed* when it has a series of any input of the loaded rules in its
family. An input is *expected* when some target exports it now (the presence check of ``healer
doctor exporters``): an input that no target exports is that command's fleet-wide finding, not
one node's. Event metrics (Xid series, absent until the first Xid) are never expected. A listed
scope is blind for a rule when, without the expected inputs it lacks, the rule's expression could
return nothing (:func:`healer.ruleset.inputs.missing_inputs`: the other side of an ``or`` and the
exception list of an ``unless`` are not needed). Besides, a GPU node (its labelled pool is not
``no-gpu``) with no dcgm-exporter series at all is blind, as a whole node, for every rule that
needs a dcgm-exporter metric.

Queries (instant, at the observation time); per rule node-label chain and family:

1. presence, once: ``group by (__name__) ({__name__=~"<every input name>"})``;
2. per expected input ``I``: the listed scopes that lack it, so the answer is small at any fleet
   size (usually empty)::

       group by (<chain>, instance, <scope>) ({__name__=~"<listing>"})
       unless on (<chain>[, instance], <scope>) group by (<chain>, instance, <scope>) ({__name__=~"<I>"})

   ``instance`` joins the ``on`` for node_exporter (whose series may carry no node label, the
   address then names the node) and not for dcgm-exporter (whose ``Hostname`` always names the
   node or its pod): two dcgm-exporters on one node are one node's;
3. for dcgm-exporter, when the cluster's GPU nodes are known: ``group by (<chain>, instance)
   ({__name__=~"<listing>"})``, the nodes reporting anything.

Every series' node is resolved like a rule's (:meth:`healer.model.addresses.AddressBook.resolve`):
a series that names no Node is listed as unresolved and counted for no node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from healer.engine.evaluation import node_of
from healer.engine.labels import clean_labels, clean_node_name
from healer.errors import SourceError
from healer.model.addresses import AddressBook
from healer.model.blind_spots import WHOLE_NODE, BlindReport, BlindSpot, UnresolvedSeries
from healer.ruleset.device_filter import device_matchers_in, promql_string
from healer.ruleset.inputs import EVENT_METRICS, Input, PromqlSyntax, inputs, missing_inputs
from healer.ruleset.schema import RuleSet
from healer.sources.base import Deadline, MetricsSource

#: Most unresolved series kept in one report (each names its reason; the count is exact).
MAX_UNRESOLVED = 20


@dataclass(frozen=True)
class Family:
    """An exporter's metrics, compared scope by scope.

    ``prefix``: the metric names' prefix; ``scope``: the labels naming one scope; ``unscoped``:
    names of the family without those labels (never listed); ``join_instance``: whether the
    scrape address joins the node labels in matching (series that may carry no node label).
    """

    name: str
    prefix: str
    scope: tuple[str, ...]
    unscoped: frozenset[str] = frozenset()
    join_instance: bool = True

    def describe(self, labels: Mapping[str, str]) -> str:
        """The scope's words: ``"gpu 3"``, ``"mlx5_0 port 1"``."""
        if self.scope == ("gpu",):
            return f"gpu {labels.get('gpu', '?')}"
        return f"{labels.get('device', '?')} port {labels.get('port', '?')}"


DCGM = Family("dcgm-exporter", "DCGM_", ("gpu",), join_instance=False)
INFINIBAND = Family(
    "node_exporter infiniband",
    "node_infiniband_",
    ("device", "port"),
    unscoped=frozenset({"node_infiniband_info"}),
)
FAMILIES = (DCGM, INFINIBAND)


def family_of(i: Input) -> Family | None:
    """The family every name of ``i`` belongs to, or None (another exporter, or mixed names)."""
    for fam in FAMILIES:
        if all(n.startswith(fam.prefix) and n not in fam.unscoped for n in i.names):
            return fam
    return None


@dataclass(frozen=True)
class Plan:
    """What to ask for one node-label chain and family: the ``listing`` names and the ``inputs``
    of that family the chain's rules read (event metrics left out)."""

    chain: tuple[str, ...]
    family: Family
    listing: tuple[str, ...]
    inputs: tuple[Input, ...]
    #: Label matchers every selector of the family carries in the chain's rules (the InfiniBand
    #: device filter, ``device=~"...", device!~"..."``): ports the rules leave out are not judged.
    matchers: str = ""


def _rule_inputs(expr: str) -> list[Input]:
    try:
        return inputs(expr)
    except PromqlSyntax:  # rule validation reports it
        return []


def _judged(i: Input) -> bool:
    return family_of(i) is not None and not all(n in EVENT_METRICS for n in i.names)


def plans(ruleset: RuleSet) -> list[Plan]:
    """One plan per (chain, family) the rules read, in a stable order."""
    found: dict[tuple[tuple[str, ...], str], set[Input]] = {}
    device: dict[tuple[tuple[str, ...], str], set[frozenset[tuple[str, str]] | None]] = {}
    fams = {f.name: f for f in FAMILIES}
    for rule in ruleset.rules:
        for i in _rule_inputs(rule.expr):
            fam = family_of(i)
            if fam is not None and _judged(i):
                found.setdefault((rule.node_labels, fam.name), set()).add(i)
                if fam is INFINIBAND:
                    device.setdefault((rule.node_labels, fam.name), set()).add(device_matchers_in(rule.expr))
    return [
        Plan(
            chain=chain,
            family=fams[name],
            listing=tuple(sorted({n for i in ins for n in i.names})),
            inputs=tuple(sorted(ins)),
            matchers=_matchers_text(device.get((chain, name), set())),
        )
        for (chain, name), ins in sorted(found.items())
    ]


def _matchers_text(seen: set[frozenset[tuple[str, str]] | None]) -> str:
    """The matchers every rule of a plan agrees on, as PromQL (``""`` when they differ)."""
    if len(seen) != 1 or None in seen:
        return ""
    (only,) = seen
    assert only is not None
    return "".join(f", device{op}{promql_string(value)}" for op, value in sorted(only))


def _names_regex(names: Iterable[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(names))


def lacking_query(plan: Plan, i: Input) -> str:
    """The PromQL listing ``plan``'s scopes (with their node labels and ``instance``) lacking ``i``."""
    by = ", ".join([*plan.chain, "instance", *plan.family.scope])
    on = ", ".join([*plan.chain, *(["instance"] if plan.family.join_instance else []), *plan.family.scope])
    extra = plan.matchers
    return (
        f'group by ({by}) ({{__name__=~"{_names_regex(plan.listing)}"{extra}}}) '
        f'unless on ({on}) group by ({by}) ({{__name__=~"{_names_regex(i.names)}"{extra}}})'
    )


def reporting_query(plan: Plan) -> str:
    """The PromQL listing the nodes (node labels and ``instance``) with any series of ``plan``."""
    by = ", ".join([*plan.chain, "instance"])
    return f'group by ({by}) ({{__name__=~"{_names_regex(plan.listing)}"}})'


def presence_of(ruleset: RuleSet) -> str:
    """The PromQL whose answer names every judged input name some target exports now."""
    names = {n for p in plans(ruleset) for n in p.listing}
    return f'group by (__name__) ({{__name__=~"{_names_regex(names)}"}})' if names else ""


@dataclass
class Answers:
    """What the queries returned: ``present`` names; ``lacking[(plan index, input)]`` the label
    sets of the scopes lacking it; ``reporting[plan index]`` the label sets of nodes reporting
    the plan's family; ``errors`` the queries that failed."""

    present: set[str] = field(default_factory=set)
    lacking: dict[tuple[int, Input], list[dict[str, str]]] = field(default_factory=dict)
    reporting: dict[int, list[dict[str, str]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _series_text(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class _Resolver:
    """A series' node, with the unresolved ones kept (each series once)."""

    def __init__(self, book: AddressBook | None) -> None:
        self.book = book
        self.unresolved: dict[str, UnresolvedSeries] = {}
        self.unresolved_count = 0

    def node(self, labels: Mapping[str, str], chain: Sequence[str]) -> str | None:
        clean, _ = clean_labels(labels)
        if self.book is None:
            raw = node_of(clean, chain)
            why = f"none of the labels {', '.join(chain)} is set"
        else:
            resolved = self.book.resolve(clean, chain)
            raw, why = resolved.node, resolved.why or "unresolved"
        if raw is None:
            text = _series_text(clean)
            if text not in self.unresolved:
                self.unresolved_count += 1
                if len(self.unresolved) < MAX_UNRESOLVED:
                    self.unresolved[text] = UnresolvedSeries(series=text, why=why)
            return None
        return clean_node_name(raw)


def judge(
    *,
    ruleset: RuleSet,
    answers: Answers,
    now: datetime,
    book: AddressBook | None = None,
    gpu_nodes: Iterable[str] | None = None,
) -> BlindReport:
    """The blind spots the ``answers`` show (pure).

    Args:
        ruleset: the loaded rules.
        answers: the queries' results for :func:`plans` of ``ruleset`` (indexes into that list).
        now: the observation time, recorded in the report.
        book: the cluster's address book, which checks each series' node; None: node labels are
            taken as they are.
        gpu_nodes: the cluster's GPU nodes (names), for the whole-node spots; None: not known.
    """
    all_plans = plans(ruleset)
    resolver = _Resolver(book)
    # (chain, family) → (node, scope words) → the expected inputs it lacks
    lack: dict[tuple[tuple[str, ...], str], dict[tuple[str, str], set[Input]]] = {}
    for (index, i), rows in answers.lacking.items():
        plan = all_plans[index]
        places = lack.setdefault((plan.chain, plan.family.name), {})
        for labels in rows:
            node = resolver.node(labels, plan.chain)
            if node is not None:
                places.setdefault((node, plan.family.describe(labels)), set()).add(i)
    reporting: set[str] = set()
    for index, rows in answers.reporting.items():
        for labels in rows:
            node = resolver.node(labels, all_plans[index].chain)
            if node is not None:
                reporting.add(node)

    present = answers.present
    every_name = {n for p in all_plans for n in p.listing}
    # Names no target exports are treated as there: their absence is the fleet's, not a node's.
    absent_fleet_wide = every_name - present
    spots: list[BlindSpot] = []
    judged: list[str] = []
    dcgm_names = {n for p in all_plans if p.family is DCGM for n in p.listing}
    silent = (
        sorted({clean_node_name(n) for n in gpu_nodes} - reporting)
        if gpu_nodes is not None and dcgm_names & present and answers.reporting
        else []
    )
    for rule in ruleset.rules:
        rule_inputs = [i for i in _rule_inputs(rule.expr) if _judged(i)]
        if not rule_inputs:
            continue
        judged.append(rule.name)
        fams = {f.name for i in rule_inputs if (f := family_of(i)) is not None}
        # Thousands of GPUs lacking the same inputs are one question per rule, not thousands.
        verdicts: dict[frozenset[Input], list[str]] = {}
        for fam in sorted(fams):
            for (node, scope), lacking in sorted(lack.get((rule.node_labels, fam), {}).items()):
                key = frozenset(lacking)
                if key not in verdicts:
                    gone = {n for i in lacking for n in i.names}
                    seen = (every_name - gone) | absent_fleet_wide
                    verdicts[key] = [str(i) for i in missing_inputs(rule.expr, seen) if _judged(i)]
                missing = verdicts[key]
                if missing:
                    spots.append(
                        BlindSpot(
                            node=node,
                            rule=rule.name,
                            scope=scope,
                            missing=tuple(missing),
                            why=f"{scope} exports no {', '.join(missing)}, which other targets export",
                        )
                    )
        if DCGM.name in fams and silent:
            seen = (every_name - dcgm_names) | absent_fleet_wide
            missing = [str(i) for i in missing_inputs(rule.expr, seen) if _judged(i)]
            spots += [
                BlindSpot(
                    node=node,
                    rule=rule.name,
                    scope=WHOLE_NODE,
                    missing=tuple(missing),
                    why="a GPU node with no dcgm-exporter series (not scraped, or no exporter runs there)",
                )
                for node in silent
                if missing
            ]
    found = tuple(sorted(set(spots)))
    per_rule: dict[str, int] = {}
    for spot in found:
        per_rule[spot.rule] = per_rule.get(spot.rule, 0) + 1
    return BlindReport(
        observed_at=now,
        spots=found,
        total=len(found),
        per_rule=per_rule,
        unresolved=tuple(sorted(resolver.unresolved.values())),
        errors=tuple(answers.errors),
        rules=tuple(judged),
    )


def ask(
    *,
    ruleset: RuleSet,
    source: MetricsSource,
    now: datetime,
    with_reporting: bool,
    deadline: Deadline | None = None,
) -> Answers:
    """Run the queries of :func:`plans` at ``now``; a failed query is kept in ``errors`` (its
    spots are then unknown), never raised."""
    answers = Answers()
    presence = presence_of(ruleset)
    if not presence:
        return answers
    try:
        answer = source.query(presence, at=now, deadline=deadline)
    except SourceError as exc:
        answers.errors.append(f"which inputs exist: {exc}")
        return answers
    answers.present = {s.labels.get("__name__", "") for s in answer.samples}
    for index, plan in enumerate(plans(ruleset)):
        listed = set(plan.listing) & answers.present
        for i in plan.inputs:
            names = set(i.names)
            if not names & answers.present or not listed - names:
                continue  # nobody exports it, or nothing else lists a scope: nothing to compare
            try:
                result = source.query(lacking_query(plan, i), at=now, deadline=deadline)
            except SourceError as exc:
                answers.errors.append(f"{i}: {exc}")
                continue
            answers.lacking[(index, i)] = [dict(s.labels) for s in result.samples]
        if with_reporting and plan.family is DCGM and listed:
            try:
                result = source.query(reporting_query(plan), at=now, deadline=deadline)
            except SourceError as exc:
                answers.errors.append(f"nodes reporting {plan.family.name}: {exc}")
                continue
            answers.reporting[index] = [dict(s.labels) for s in result.samples]
    return answers


def observe_blind_spots(
    *,
    ruleset: RuleSet,
    source: MetricsSource,
    now: datetime,
    book: AddressBook | None = None,
    gpu_nodes: Iterable[str] | None = None,
    deadline: Deadline | None = None,
) -> BlindReport:
    """Every rule's blind spots at ``now`` (queries of :func:`ask`, then :func:`judge`)."""
    gpu_list = list(gpu_nodes) if gpu_nodes is not None else None
    answers = ask(
        ruleset=ruleset, source=source, now=now, with_reporting=gpu_list is not None, deadline=deadline
    )
    return judge(ruleset=ruleset, answers=answers, now=now, book=book, gpu_nodes=gpu_list)
