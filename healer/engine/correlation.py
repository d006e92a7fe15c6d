"""Correlation: findings on k of n nodes of one domain within a window are one domain fault. Pure.

A *domain* is a set of nodes that share one part whose failure looks like many node failures: a
rack (power, cooling), an InfiniBand leaf or spine switch, an NVLink domain (an NVL72 rack's
NVSwitch trays, ``nvidia.com/gpu.clique``), a zone. :func:`correlate` takes, per node, when its
current bad episode was first seen (the earliest ``active_since`` of its pending or firing
findings of rules that take nodes out, as the store gives them), the topology (node → its domain of
each kind) and the per-kind thresholds, and returns the domain faults and the nodes they absorb.
A kind may count only some rules' findings (an InfiniBand leaf: the InfiniBand rules).

A domain of kind K with n nodes is faulty when at least ``min_nodes`` of its nodes, and at least
``min_percent`` % of n, were first seen bad within ``window_seconds`` of each other, the last of
them no longer ago than ``window_seconds`` (a storm, not a slow trickle of unrelated failures).
A domain fault already open (``already_open``) keeps its members and absorbs every further node of the
domain that turns bad while it is open, whenever that is.

Overlapping domains (a leaf switch's 16 nodes span four racks): the candidate faults are taken in
order of nodes explained (most first), then smaller domain (more specific), then kind order, then
name; each node goes to the first that claims it, and a later candidate counts only the nodes left
to it, so it must still meet its own thresholds. One cause, one incident.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from healer.model.findings import TickFindings
from healer.ruleset.schema import RuleSet


@dataclass(frozen=True)
class DomainKey:
    """One domain: its kind (``rack``, ``ib_leaf``, ...) and its name within the kind."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class Threshold:
    """When a domain of one kind is faulty: ``min_nodes`` (count) and ``min_percent`` (% of the
    domain's nodes, 0..100) first seen bad within ``window_seconds`` (seconds), counting the
    findings of ``rules`` only (empty: every rule given)."""

    min_nodes: int
    min_percent: float
    window_seconds: float
    rules: frozenset[str] = frozenset()

    def bad_since(self, findings: Mapping[str, Sequence[tuple[str, datetime]]]) -> dict[str, datetime]:
        """node → the earliest first-seen time of its findings this kind counts."""
        out: dict[str, datetime] = {}
        for node, found in findings.items():
            times = [at for rule, at in found if not self.rules or rule in self.rules]
            if times:
                out[node] = min(times)
        return out

    def needed(self, size: int) -> int:
        """Bad nodes that make a domain of ``size`` nodes faulty (never fewer than 2: one node is
        a node fault)."""
        by_percent = math.ceil(size * self.min_percent / 100.0 - 1e-9)
        return max(2, self.min_nodes, by_percent)


@dataclass(frozen=True)
class DomainFault:
    """A faulty domain: its key, its size (nodes in the topology), the nodes it absorbs (sorted),
    when the first of them was seen bad, and whether it was open before this call (``opened``
    False) or is new (True)."""

    key: DomainKey
    size: int
    nodes: tuple[str, ...]
    first_seen: datetime
    opened: bool


@dataclass(frozen=True)
class OpenDomain:
    """A domain fault already open: its members so far and when it was first seen."""

    key: DomainKey
    members: frozenset[str]
    first_seen: datetime


@dataclass(frozen=True)
class Correlation:
    """:func:`correlate`'s answer: every domain fault (open ones first, then new ones, each sorted by
    key) and node → the domain that absorbs it."""

    faults: tuple[DomainFault, ...]
    absorbed: Mapping[str, DomainKey]

    @property
    def new(self) -> tuple[DomainFault, ...]:
        return tuple(f for f in self.faults if f.opened)


#: node → {kind: domain name}
Topology = Mapping[str, Mapping[str, str]]


def members(topology: Topology) -> dict[DomainKey, frozenset[str]]:
    """Each domain's nodes, from the topology."""
    out: dict[DomainKey, set[str]] = {}
    for node, domains in topology.items():
        for kind, name in domains.items():
            if name:
                out.setdefault(DomainKey(kind, name), set()).add(node)
    return {key: frozenset(nodes) for key, nodes in out.items()}


def _densest(times: Sequence[tuple[datetime, str]], window: timedelta) -> list[str]:
    """The largest set of nodes whose first-seen times fit in one span of ``window`` (earliest such
    span on a tie); ``times`` sorted by time."""
    best: list[str] = []
    start = 0
    for end in range(len(times)):
        while times[end][0] - times[start][0] > window:
            start += 1
        if end - start + 1 > len(best):
            best = [name for _, name in times[start : end + 1]]
    return best


def correlate(
    *,
    findings: Mapping[str, Sequence[tuple[str, datetime]]],
    topology: Topology,
    thresholds: Mapping[str, Threshold],
    now: datetime,
    already_open: Sequence[OpenDomain] = (),
    kind_order: Sequence[str] = (),
) -> Correlation:
    """The domain faults now.

    Args:
        findings: node → (rule, first seen) of each of its pending or firing findings of a rule
            that takes nodes out (aware UTC, the store's ``active_since``); nodes not bad (healthy,
            or blind: no data is not a fault) are absent.
        topology: node → {kind: domain name} (:func:`healer.topology.build`).
        thresholds: kind → :class:`Threshold`; a kind missing here is never correlated.
        now: the evaluation time (aware UTC).
        already_open: domain faults already open (their members stay absorbed; new bad nodes of the domain
            join them).
        kind_order: kinds, most specific first, to break ties between equal candidates (kinds not
            listed come after, by name).

    Returns:
        The open faults (with the nodes that joined) and the new ones, and node → absorbing domain.
    """
    domains = members(topology)
    rank = {kind: i for i, kind in enumerate(kind_order)}
    bad = {kind: t.bad_since(findings) for kind, t in thresholds.items()}
    absorbed: dict[str, DomainKey] = {}
    faults: list[DomainFault] = []
    for fault in sorted(already_open, key=lambda o: (o.key.kind, o.key.name)):
        joined = {n for n in domains.get(fault.key, frozenset()) if n in bad.get(fault.key.kind, {})}
        nodes = sorted((set(fault.members) | joined) - set(absorbed))
        for node in nodes:
            absorbed[node] = fault.key
        size = len(domains.get(fault.key, frozenset())) or len(nodes)
        faults.append(DomainFault(fault.key, size, tuple(nodes), fault.first_seen, opened=False))

    candidates: list[tuple[DomainKey, int, list[str]]] = []
    for key, domain_nodes in domains.items():
        threshold = thresholds.get(key.kind)
        if threshold is None:
            continue
        window = timedelta(seconds=threshold.window_seconds)
        bad_since = bad[key.kind]
        times = sorted(
            (at, n) for n in domain_nodes if n not in absorbed and (at := bad_since.get(n)) is not None
        )
        recent = [(at, n) for at, n in times if now - at <= window]
        if len(recent) < threshold.needed(len(domain_nodes)):
            continue
        candidates.append((key, len(domain_nodes), _densest(recent, window)))
    candidates.sort(key=lambda c: (-len(c[2]), c[1], rank.get(c[0].kind, len(rank)), c[0].kind, c[0].name))
    new: list[DomainFault] = []
    for key, size, nodes in candidates:
        left = [n for n in nodes if n not in absorbed]
        if len(left) < thresholds[key.kind].needed(size):
            continue
        for node in left:
            absorbed[node] = key
        first = min(bad[key.kind][n] for n in left)
        new.append(DomainFault(key, size, tuple(sorted(left)), first, opened=True))
    new.sort(key=lambda f: (f.key.kind, f.key.name))
    return Correlation(tuple(faults + new), absorbed)


def bad_findings(findings: TickFindings, rules: RuleSet) -> dict[str, list[tuple[str, datetime]]]:
    """node → (rule, first seen) of its pending and firing findings of rules that quarantine or
    taint: :func:`correlate`'s input from one tick. Frozen rules, unknown nodes and rules not in the
    rule set are left out (no data is not a fault)."""
    takes_out = {r.name for r in rules.rules if {a.kind for a in r.actions} & {"quarantine", "taint"}}
    out: dict[str, list[tuple[str, datetime]]] = {}
    for per_node in (findings.firing, findings.pending):
        for node, found in per_node.items():
            if node in findings.unknown:
                continue
            for f in found:
                if f.rule in takes_out and f.rule not in findings.frozen_rules:
                    out.setdefault(node, []).append((f.rule, f.active_since or f.fired_at or findings.at))
    return out


def collapse(turned_bad: Mapping[str, datetime], absorbed: Mapping[str, str]) -> dict[str, datetime]:
    """The circuit breaker's input with each domain counted once: the nodes ``absorbed`` (node →
    domain) replaced by one entry per domain, keyed by the domain, at its earliest time."""
    out: dict[str, datetime] = {}
    for node, at in turned_bad.items():
        key = absorbed.get(node, node)
        out[key] = min(at, out.get(key, at))
    return out
