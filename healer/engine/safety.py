"""Safety: approve or refuse each step the lifecycle wants. Pure, table-driven, time passed in.

A step is judged by :data:`CHECKS`, in order; the first check that applies refuses it:

====================  ==============================  =====================================  =======
reason                step kinds it refuses           when                                   outcome
====================  ==============================  =====================================  =======
``opt-out``           every step that touches a node  the node carries the opt-out label     hold
``burst-node``        every step that touches a node  a capacity rule's burst node           hold
``paused``            quarantine, drain, ticket       an operator paused healer              hold
``maintenance``       quarantine, drain               a maintenance window of the pool       hold
``breaker``           new quarantine                  the circuit breaker is tripped         blocked
``budget``            new quarantine                  the pool's budget is used up           blocked
====================  ==============================  =====================================  =======

*hold*: the node stays where it is and the refusal is recorded; *blocked*: the node moves to
``blocked`` with the reason, and is re-evaluated against fresh findings every tick (never replayed).
A "new quarantine" takes a node out of service that does not count against its pool yet.

The budget (Cluster API MachineHealthCheck ``maxUnhealthy``, medik8s ``maxUnhealthy``) caps the
nodes of a pool out of service at once: ``max_unhealthy`` nodes and ``max_unhealthy_percent`` of
the pool, rounded down as Cluster API does, whichever is smaller. Nodes already out of service
(quarantined ... validating, or blocked with a cordon on) and quarantines approved earlier in the
same tick count. The pool is the rule's node pool (:mod:`healer.engine.pools`: the nodes its
metrics cover, or the nodes its ``pool.node_selector`` names); a node whose quarantine is on account
of several rules must fit the budget of each of their pools.

Tiny pools (the absolute floor). Cluster API rounds the percentage down ("40 % of 6 machines: 2 may
be unhealthy"), so 10 % of a pool under 10 nodes is 0 and such a pool could never be remediated.
healer's rule: **every pool may always have ``budget_floor_nodes`` (default 1) node(s) out of
service, however small it is** (never more than ``max_unhealthy``, so ``max_unhealthy: 0`` still
means none); **the breaker's percentage never trips on fewer than ``breaker_min_nodes`` (default
3) bad nodes of a pool**, so a pool of fewer than 3 nodes never trips it by percentage (only the
absolute ``breaker_nodes`` count, over all pools, does). NVSentinel's breaker has the same two
parts: a percentage of the nodes within a sliding window, and a manual reset.

The circuit breaker (NVSentinel's: % of the fleet within a sliding window, plus an absolute count)
trips when more than ``breaker_nodes`` nodes, or more than ``breaker_percent`` % of one pool (and at
least ``breaker_min_nodes`` of its nodes), turned bad (a quarantining rule started firing) within
``breaker_window_seconds``. The percentage is of the pool, not of the cluster: CPU nodes never
dilute a GPU pool, and the floor keeps one bad node in a pool of four from tripping it. An exporter bug
or a cooling failure looks like that, and cordoning half a cluster makes it worse. It holds until a
human resets it (``healer breaker reset``); nodes that turned bad before the reset do not trip it
again, so the reset re-evaluates them one by one against the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, time, timedelta
from enum import StrEnum

from healer.engine.lifecycle import StepKind
from healer.model.limits import MaintenanceWindow, SafetyLimits

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class Refusal(StrEnum):
    """Why a step was refused (the ``actions.error`` of a refused action)."""

    OPT_OUT = "opt-out"
    BURST_NODE = "burst-node"
    PAUSED = "paused"
    MAINTENANCE = "maintenance"
    BREAKER = "breaker"
    BUDGET = "budget"


@dataclass(frozen=True)
class Request:
    """A wanted step on one node: its kind, the node's pool, and whether it counts already."""

    node: str
    kind: StepKind
    pool: str = "default"
    opted_out: bool = False
    #: The capacity rule whose burst node this is ("" when it is none): never a health rule's.
    burst_rule: str = ""
    already_out: bool = False  # the node already counts against its pool (no new budget slot)
    pools: tuple[str, ...] = ()  # the rule pools the step counts against; empty = (pool,)
    #: The domain incident absorbing the node ("" when none): a domain counts once in the budget.
    domain: str = ""

    @property
    def counted_in(self) -> tuple[str, ...]:
        """Every pool whose budget this step must fit."""
        return self.pools or (self.pool,)


@dataclass(frozen=True)
class Decision:
    """The verdict on one :class:`Request`; ``reason`` is None when approved."""

    approved: bool
    reason: Refusal | None = None
    message: str = ""
    blocks: bool = False  # a refusal that moves the node to ``blocked`` (budget, breaker)


@dataclass(frozen=True)
class PoolUsage:
    """A pool's size and how many of its nodes are out of service now (counts)."""

    size: int
    out: int = 0

    def limit(self, settings: SafetyLimits) -> int:
        """Nodes that may be out at once: the smaller of the absolute and the % cap (rounded down),
        never under the floor for tiny pools (``budget_floor_nodes``, at most ``max_unhealthy``
        and the pool's size)."""
        floor = min(settings.budget_floor_nodes, settings.max_unhealthy, self.size)
        return max(self.capped(settings), floor)

    def capped(self, settings: SafetyLimits) -> int:
        """The smaller of the absolute and the % cap (rounded down, as Cluster API does), no floor."""
        by_percent = math.floor(self.size * settings.max_unhealthy_percent / 100.0 + 1e-9)
        return min(settings.max_unhealthy, by_percent)


@dataclass(frozen=True)
class SafetyState:
    """What safety knows during one tick. ``pools`` grows as quarantines are approved.

    ``settings`` are the limits (``SafetySettings.limits()`` builds them from the configuration).
    Pools come as counts (``pools``: pool → usage) or as node sets (``members``: pool → nodes, with
    ``out_nodes`` the nodes out of service): a node belongs to several rule pools at once, and an
    approved quarantine then counts in each of them.
    """

    settings: SafetyLimits
    now: datetime
    paused: bool = False
    breaker_tripped: bool = False
    pools: Mapping[str, PoolUsage] = field(default_factory=dict)
    members: Mapping[str, frozenset[str]] = field(default_factory=dict)
    out_nodes: frozenset[str] = frozenset()
    #: node → the domain incident absorbing it: the out nodes of one domain count as one.
    domains: Mapping[str, str] = field(default_factory=dict)

    def usage(self, pool: str) -> PoolUsage:
        """The pool's size and how many of its nodes are out (counted from ``members`` if known;
        the nodes of one domain incident count once)."""
        if pool in self.members:
            nodes = self.members[pool]
            out = {self.domains.get(n, n) for n in nodes & self.out_nodes}
            return PoolUsage(size=len(nodes), out=len(out))
        return self.pools.get(pool, PoolUsage(size=0))

    def domain_out(self, domain: str) -> bool:
        """Whether a node of ``domain`` is out already (its slot is taken: the next ones are free)."""
        return bool(domain) and any(self.domains.get(n) == domain for n in self.out_nodes)


def in_window(window: MaintenanceWindow, now: datetime) -> bool:
    """Whether ``now`` (aware, UTC) is inside ``window``.

    ``start``/``end`` are HH:MM UTC; ``end`` at or before ``start`` spans midnight (the window
    belongs to the day it starts on, so ``fri 22:00-02:00`` covers Saturday 01:00). Equal start and
    end mean 24 hours from ``start``.
    """
    start = time.fromisoformat(window.start)
    end = time.fromisoformat(window.end)
    t = now.time().replace(tzinfo=None)
    today = _DAYS[now.weekday()]
    yesterday = _DAYS[(now - timedelta(days=1)).weekday()]
    if start < end:
        return today in window.days and start <= t < end
    return (today in window.days and t >= start) or (yesterday in window.days and t < end)


def window_for(windows: Iterable[MaintenanceWindow], pool: str, now: datetime) -> MaintenanceWindow | None:
    """The first window of ``pool`` (or ``*``) that ``now`` falls in, if any."""
    for window in windows:
        if window.pool in ("*", pool) and in_window(window, now):
            return window
    return None


def _over_budget(req: Request, state: SafetyState) -> str | None:
    for pool in req.counted_in:
        usage = state.usage(pool)
        limit = usage.limit(state.settings)
        if usage.out + 1 > limit:
            floor = "" if limit <= usage.capped(state.settings) else ", the floor for small pools"
            return (
                f"pool {pool}: {usage.out} of {usage.size} node(s) out of service, budget {limit} "
                f"(max_unhealthy {state.settings.max_unhealthy}, "
                f"{state.settings.max_unhealthy_percent:g}% of the pool{floor})"
            )
    return None


def _window_message(req: Request, state: SafetyState) -> str | None:
    window = window_for(state.settings.maintenance_windows, req.pool, state.now)
    if window is None:
        return None
    days = ",".join(window.days)
    return f"pool {req.pool} is in a maintenance window ({days} {window.start}-{window.end} UTC)"


_TOUCHING = frozenset(StepKind) - {StepKind.RECORD}


@dataclass(frozen=True)
class Check:
    """One row of the safety table: refuses ``kinds`` with ``reason`` when ``applies`` gives a
    message."""

    reason: Refusal
    kinds: frozenset[StepKind]
    applies: Callable[[Request, SafetyState], str | None]
    blocks: bool
    new_quarantine_only: bool = False


CHECKS: tuple[Check, ...] = (
    Check(
        Refusal.OPT_OUT,
        _TOUCHING,
        lambda r, s: "the node carries the opt-out label: never touched" if r.opted_out else None,
        blocks=False,
    ),
    Check(
        Refusal.BURST_NODE,
        _TOUCHING,
        lambda r, s: (
            f"a burst node of capacity rule {r.burst_rule}: health rules never quarantine, drain or ticket it"
            if r.burst_rule
            else None
        ),
        blocks=False,
    ),
    Check(
        Refusal.PAUSED,
        frozenset({StepKind.QUARANTINE, StepKind.DRAIN, StepKind.TICKET}),
        lambda r, s: "healer is paused" if s.paused else None,
        blocks=False,
    ),
    Check(
        Refusal.MAINTENANCE,
        frozenset({StepKind.QUARANTINE, StepKind.DRAIN}),
        _window_message,
        blocks=False,
    ),
    Check(
        Refusal.BREAKER,
        frozenset({StepKind.QUARANTINE}),
        lambda r, s: (
            "the circuit breaker is tripped: waiting for a human reset" if s.breaker_tripped else None
        ),
        blocks=True,
        new_quarantine_only=True,
    ),
    Check(
        Refusal.BUDGET, frozenset({StepKind.QUARANTINE}), _over_budget, blocks=True, new_quarantine_only=True
    ),
)


def judge(req: Request, state: SafetyState) -> tuple[Decision, SafetyState]:
    """Approve or refuse ``req``; returns the decision and the state with an approved new
    quarantine counted against its pool (in-flight counting within the tick)."""
    if req.domain and state.domain_out(req.domain):
        req = replace(req, already_out=True)  # the domain holds its one slot already
    for check in CHECKS:
        if req.kind not in check.kinds or (check.new_quarantine_only and req.already_out):
            continue
        message = check.applies(req, state)
        if message is not None:
            return Decision(False, check.reason, message, check.blocks), state
    if req.kind == StepKind.QUARANTINE and not req.already_out:
        counts = dict(state.pools)
        for pool in req.counted_in:
            if pool not in state.members:
                usage = state.usage(pool)
                counts[pool] = replace(usage, out=usage.out + 1)
        domains = {**state.domains, req.node: req.domain} if req.domain else state.domains
        state = replace(state, pools=counts, out_nodes=state.out_nodes | {req.node}, domains=domains)
    return Decision(True, message="approved"), state


@dataclass(frozen=True)
class PoolBreaker:
    """One pool's share of the breaker: ``count`` of its ``size`` nodes turned bad in the window."""

    pool: str
    count: int
    size: int

    @property
    def percent(self) -> float:
        return 100.0 * self.count / max(self.size, self.count, 1)


@dataclass(frozen=True)
class BreakerVerdict:
    """Whether the breaker trips now: ``count`` nodes turned bad within the window; ``percent`` is
    the worst pool's share, of ``fleet_size`` nodes (that pool's size: the denominator shown);
    ``pool`` names it (None when judged over one undivided fleet); ``nodes`` names the bad nodes."""

    trip: bool
    count: int
    percent: float
    fleet_size: int
    nodes: tuple[str, ...]
    reason: str
    pool: str | None = None
    pools: tuple[PoolBreaker, ...] = ()


def breaker_trips_at(pool_size: int, settings: SafetyLimits) -> int:
    """How many nodes of a pool of ``pool_size`` turning bad within the window trip the breaker
    (the smaller of the absolute count and the pool's percentage, never under the floor)."""
    by_count = settings.breaker_nodes + 1
    by_percent = math.floor(pool_size * settings.breaker_percent / 100.0 + 1e-9) + 1
    return min(by_count, max(settings.breaker_min_nodes, by_percent))


def breaker(
    *,
    turned_bad: Mapping[str, datetime],
    fleet_size: int,
    settings: SafetyLimits,
    now: datetime,
    reset_at: datetime | None = None,
    pools: Mapping[str, str] | None = None,
    members: Mapping[str, frozenset[str]] | None = None,
    bad_in: Mapping[str, Iterable[str]] | None = None,
) -> BreakerVerdict:
    """Count nodes that turned bad (``turned_bad``: node → when its quarantining finding fired)
    within ``breaker_window_seconds`` before ``now``, and after the last reset.

    It trips when more than ``breaker_nodes`` of them turned bad (all pools together), or when in
    one pool more than ``breaker_percent`` % of the pool's nodes did and at least
    ``breaker_min_nodes`` of them (the floor: in a pool of 4, one bad node is 25 % but never trips).

    The denominators, either:

    * ``members`` (pool → its nodes: the rules' node pools, :mod:`healer.engine.pools`) with
      ``bad_in`` (bad node → the pools it turned bad in: those of the rules that fired on it); a
      bad node missing from ``bad_in`` counts in no pool, only in the absolute count; or
    * ``pools`` (every node of the cluster → its one pool); a bad node missing from it counts in
      pool ``default``; or
    * neither: the fleet is one pool of ``fleet_size`` nodes.
    """
    since = now - timedelta(seconds=settings.breaker_window_seconds)
    if reset_at is not None and reset_at > since:
        since = reset_at
    nodes = tuple(sorted(n for n, at in turned_bad.items() if since <= at <= now))
    count = len(nodes)
    if members is None and pools is not None:
        grouped: dict[str, set[str]] = {}
        for node, pool in pools.items():
            grouped.setdefault(pool, set()).add(node)
        members = {p: frozenset(ns) for p, ns in grouped.items()}
        bad_in = {n: (pools.get(n, "default"),) for n in nodes}
    if members is None:
        shares = [PoolBreaker("", count, max(fleet_size, count, 1))]
    else:
        bad: dict[str, int] = {}
        for n in nodes:
            for pool in set((bad_in or {}).get(n, ())):
                bad[pool] = bad.get(pool, 0) + 1
        shares = sorted(
            (PoolBreaker(p, c, max(len(members.get(p, ())), c)) for p, c in bad.items()),
            key=lambda s: (-s.percent, s.pool),
        ) or [PoolBreaker("", 0, max(len(set().union(*members.values())) if members else 0, 1))]
    worst = max(shares, key=lambda s: (s.count >= settings.breaker_min_nodes, s.percent))
    over_count = count > settings.breaker_nodes
    over_percent = worst.count >= settings.breaker_min_nodes and worst.percent > settings.breaker_percent
    reason = ""
    if over_count or over_percent:
        where, limit = "", f"limit {settings.breaker_nodes} node(s) or {settings.breaker_percent:g}%"
        if worst.pool:
            where = f", {worst.count} of pool {worst.pool}'s {worst.size} node(s)"
            limit += f" of a pool (at least {settings.breaker_min_nodes} node(s))"
        reason = (
            f"{count} node(s) ({worst.percent:.0f}% of {worst.size}) turned bad within "
            f"{settings.breaker_window_seconds:g} s{where}; {limit}"
        )
    return BreakerVerdict(
        over_count or over_percent,
        count,
        worst.percent,
        worst.size,
        nodes,
        reason,
        pool=worst.pool or None,
        pools=tuple(s for s in shares if s.pool),
    )
