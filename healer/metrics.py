"""healer's own Prometheus metrics (served at ``/metrics``).

Two kinds:

* Event metrics the controller updates as it works (:class:`HealerMetrics` methods): ticks, tick
  duration, per-rule health, actions by kind and result, Alertmanager's notifications by result.
* State metrics read from the database on each scrape (:class:`DatabaseCollector`): nodes by
  lifecycle state, pending and firing findings per rule, breaker and pause switches, outbox depth
  and delivery failures. Reading them at
  scrape time keeps them right on every replica, leader or not, and after a restart.

Nothing here is a module-level global: the composition root builds one :class:`HealerMetrics`
(holding its own ``CollectorRegistry``) and passes it to the controller and the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from healer.clock import utc_now
from healer.model.blind_spots import BlindReport
from healer.model.findings import UnresolvedSeries
from healer.model.states import FindingState, NodeState, OutboxStatus, RuleHealth
from healer.store import burst as burst_store
from healer.store import nodes as repo
from healer.store import parts
from healer.store.models import Finding, Incident, Node, OutboxMessage

#: Tick durations, seconds: a tick is a handful of PromQL queries plus database writes; the
#: default deadline is 30 s, so buckets reach past it to show ticks that overran.
TICK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)


class HealerMetrics:
    """The metrics of one healer process, in their own registry (``self.registry``)."""

    #: The watched store of Nodes in this process (``healer run``), for ``/readyz``; None: none.
    node_watch: WatchedStore | None = None

    def watch_nodes(self, watch: WatchedStore) -> None:
        """Export the node watch's freshness (:mod:`healer.actions.node_watch`) and keep it for
        ``/readyz``: ``healer_node_watch_age_seconds`` (-1 before its first list) and
        ``healer_node_watch_lists`` (LIST requests it made: 1 on a healthy watch)."""
        self.node_watch = watch
        age = Gauge(
            "healer_node_watch_age_seconds",
            "Seconds since the watched store of Nodes last heard from the API server (an event, a "
            "bookmark, a new watch or a list); -1 before its first list and while its watch is down "
            "(the controller then lists Nodes itself, as it does past 3 minutes of silence).",
            registry=self.registry,
        )
        age.set_function(lambda: _or_minus_one(watch.age_seconds()))
        lists = Gauge(
            "healer_node_watch_lists",
            "LIST requests of Nodes the watch made since start (the first, then one per expired "
            "resourceVersion).",
            registry=self.registry,
        )
        lists.set_function(lambda: float(watch.lists))

    def watch_stores(self, stores: Mapping[str, WatchedStore]) -> None:
        """Export the freshness of the other watched stores (pods, PodDisruptionBudgets:
        :mod:`healer.actions.pod_watch`), labelled by resource: ``healer_watch_age_seconds`` (-1
        before the first list and while the watch is down) and ``healer_watch_lists``."""
        self.registry.register(_WatchedStores(dict(stores)))

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._database: DatabaseCollector | None = None
        self.ticks = Counter(
            "healer_ticks",
            "Ticks run (query, evaluate, act, record), by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.tick_duration = Histogram(
            "healer_tick_duration_seconds",
            "Wall time of one tick, seconds.",
            buckets=TICK_BUCKETS,
            registry=self.registry,
        )
        self.rule_health = Gauge(
            "healer_rule_health",
            "1 for the health of each rule's last evaluation (ok, no_data, degraded, error, "
            "unavailable), else 0.",
            ["rule", "health"],
            registry=self.registry,
        )
        self.rule_last_evaluation = Gauge(
            "healer_rule_last_evaluation_timestamp_seconds",
            "Unix time of each rule's last evaluation.",
            ["rule"],
            registry=self.registry,
        )
        self.domain_incidents = Gauge(
            "healer_domain_incidents_open",
            "Open domain incidents (k of n nodes of one rack, switch or NVLink domain bad together) "
            "by domain kind, as of the last tick.",
            ["kind"],
            registry=self.registry,
        )
        self.domain_nodes = Gauge(
            "healer_domain_incident_nodes",
            "Nodes absorbed by open domain incidents, by domain kind, as of the last tick.",
            ["kind"],
            registry=self.registry,
        )
        self.actions = Counter(
            "healer_actions",
            "Actions taken, dry-run or refused, by kind (cordon, drain, ticket, ...) and result.",
            ["kind", "result"],
            registry=self.registry,
        )
        self.unresolved_series = Gauge(
            "healer_rule_unresolved_series",
            "Series of each rule's last evaluation that name no node (no node label, and their "
            "instance address is no Node's and no exporter pod's): they can act on nothing. "
            "example_instance is one of their instance labels.",
            ["rule", "example_instance"],
            registry=self.registry,
        )
        self._unresolved_example: dict[str, str] = {}
        self.alertmanager_notifications = Counter(
            "healer_alertmanager_notifications",
            "Alertmanager webhook requests, by result: woken (an early tick), not_ours (no alert of "
            "healer's rules), refused (401: no or a wrong token), malformed (400), standby (503: "
            "not the leader), no_controller (404: healer serve).",
            ["result"],
            registry=self.registry,
        )
        self.label_values_cleaned = Counter(
            "healer_label_values_cleaned",
            "Series evaluated with label values cleaned first (NUL, invalid text, overlong node "
            "names), by rule: an exporter is reporting something odd.",
            ["rule"],
            registry=self.registry,
        )

        self.kueue_quota = Gauge(
            "healer_kueue_nominal_quota",
            "The nominalQuota (GPUs) of each managed ClusterQueue's flavor after healer's last sync: "
            "the one it set, else the one it read (dry-run: the one it would set). Leader only.",
            ["cluster_queue", "flavor"],
            registry=self.registry,
        )
        self.kueue_capacity = Gauge(
            "healer_kueue_healthy_capacity",
            "The healthy capacity (GPUs) healer computed for each managed ClusterQueue's flavor at "
            "its last sync: allocatable GPUs of Ready nodes it does not hold, minus GPUs out. "
            "Leader only.",
            ["cluster_queue", "flavor"],
            registry=self.registry,
        )
        self.gpus_out = Gauge(
            "healer_gpus_out",
            "GPUs healer has taken out one by one (DeviceTaintRule or gpus-out annotation), per "
            "node, after its last GPU isolation round (dry-run: those it would have out). Leader only.",
            ["node"],
            registry=self.registry,
        )

    def set_quota(self, cluster_queue: str, flavor: str, *, quota: int | None, capacity: int) -> None:
        """Record a managed ClusterQueue flavor's quota (GPUs; None: it has none, not shown) and the
        healthy capacity (GPUs) computed for it."""
        if quota is not None:
            self.kueue_quota.labels(cluster_queue=cluster_queue, flavor=flavor).set(quota)
        self.kueue_capacity.labels(cluster_queue=cluster_queue, flavor=flavor).set(capacity)

    def set_gpus_out(self, out: dict[str, int]) -> None:
        """Record node → GPUs out now; nodes no longer in ``out`` are dropped."""
        self.gpus_out.clear()
        for node, count in out.items():
            if count:
                self.gpus_out.labels(node=node).set(count)

    def count_cleaned(self, rule: str, series: int) -> None:
        """Count ``series`` whose label values had to be cleaned before ``rule`` could record them
        (NUL, invalid text, overlong node names; see :mod:`healer.engine.labels`)."""
        if series:
            self.label_values_cleaned.labels(rule=rule).inc(series)

    def set_domains(self, kinds: Iterable[str], absorbed: Mapping[str, tuple[str, int]]) -> None:
        """Open domain incidents and their nodes per kind (every kind in ``kinds`` written, 0 when
        none); ``absorbed``: node → (kind, domain incident id)."""
        for kind in {*kinds, *(k for k, _ in absorbed.values())}:
            of_kind = [i for k, i in absorbed.values() if k == kind]
            self.domain_incidents.labels(kind).set(len(set(of_kind)))
            self.domain_nodes.labels(kind).set(len(of_kind))

    def set_unresolved(self, rule: str, unresolved: UnresolvedSeries | None) -> None:
        """Record how many series of ``rule`` named no node (0 when ``unresolved`` is None), with
        one example ``instance``; the previous example's series is removed."""
        example = (unresolved.example_instance or "") if unresolved is not None else ""
        previous = self._unresolved_example.get(rule)
        if previous is not None and previous != example:
            self.unresolved_series.remove(rule, previous)
        self._unresolved_example[rule] = example
        count = unresolved.count if unresolved is not None else 0
        self.unresolved_series.labels(rule=rule, example_instance=example).set(count)

    def observe_tick(self, *, duration_seconds: float, ok: bool = True) -> None:
        """Count one tick and record its duration (seconds)."""
        self.ticks.labels(outcome="ok" if ok else "error").inc()
        self.tick_duration.observe(duration_seconds)

    def set_rule_health(self, rule: str, health: str, *, evaluated_at_unix: float | None = None) -> None:
        """Record a rule's latest health (one of :class:`RuleHealth`); the other health values go to 0."""
        for value in RuleHealth:
            self.rule_health.labels(rule=rule, health=str(value)).set(1.0 if value == health else 0.0)
        if evaluated_at_unix is not None:
            self.rule_last_evaluation.labels(rule=rule).set(evaluated_at_unix)

    def count_notification(self, result: str) -> None:
        """Count one Alertmanager webhook request by result (see ``healer_alertmanager_notifications``)."""
        self.alertmanager_notifications.labels(result=result).inc()

    def count_action(self, kind: str, result: str) -> None:
        """Count one action by kind and result (an :class:`~healer.model.states.ActionStatus`)."""
        self.actions.labels(kind=kind, result=str(result)).inc()

    def register_database(self, session_factory: sessionmaker[Session]) -> DatabaseCollector:
        """Add the scrape-time database collector to this registry; return it. Registering again
        (a second app over the same metrics) replaces the previous one."""
        if self._database is not None:
            self.registry.unregister(self._database)
        self._database = DatabaseCollector(session_factory)
        self.registry.register(self._database)
        return self._database

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


class DatabaseCollector(Collector):
    """Reads the fleet's state from the database on each scrape (a few aggregate queries).

    A failed read yields ``healer_database_up 0`` and no state metrics, rather than failing the scrape.
    """

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self._session_factory = session_factory

    def describe(self) -> Iterable[Metric]:
        # Describing would otherwise run the queries at registration time.
        return []

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("healer_database_up", "1 when the database answered this scrape.")
        try:
            with self._session_factory() as session:
                families = list(_state_families(session))
                families += list(_ledger_families(session, utc_now()))
                families += list(_burst_families(session))
                families += list(_trust_families(session, utc_now()))
        except SQLAlchemyError:
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families


#: How far back the rules' record (outcomes, shadow rules) looks in the metrics.
TRUST_WINDOW = timedelta(days=30)


def _trust_families(session: Session, now: datetime) -> Iterable[Metric]:
    """Each rule's record from its incidents' outcomes (:mod:`healer.engine.outcomes`) and what
    each shadow rule would have done, over :data:`TRUST_WINDOW` (incidents closed in it)."""
    from healer.engine import outcomes as oc
    from healer.store import outcomes as store

    since = now - TRUST_WINDOW
    rules, pools = oc.records(store.judged_since(session, since))
    decisions = GaugeMetricFamily(
        "healer_rule_decisions",
        "Incidents a rule took a node out for, closed in the last 30 days, by pool and outcome "
        "(confirmed, not_confirmed, undetermined).",
        labels=["rule", "pool", "outcome"],
    )
    for r in pools:
        for outcome, n in (
            ("confirmed", r.confirmed),
            ("not_confirmed", r.not_confirmed),
            ("undetermined", r.undetermined),
        ):
            decisions.add_metric([r.rule, r.pool or "", outcome], n)
    precision = GaugeMetricFamily(
        "healer_rule_precision",
        "Confirmed / decided incidents of a rule closed in the last 30 days (absent: none decided).",
        labels=["rule"],
    )
    false_q = GaugeMetricFamily(
        "healer_rule_false_quarantines",
        "A rule's not-confirmed incidents closed in the last 30 days.",
        labels=["rule"],
    )
    gpu_hours = GaugeMetricFamily(
        "healer_rule_gpu_hours_out",
        "GPU-hours a rule's incidents closed in the last 30 days took out of service.",
        labels=["rule"],
    )
    ttr = GaugeMetricFamily(
        "healer_rule_time_to_repair_seconds",
        "Median time from a node leaving service to its return, a rule's incidents closed in the "
        "last 30 days, seconds (absent: none returned).",
        labels=["rule"],
    )
    for r in rules:
        if r.precision is not None:
            precision.add_metric([r.rule], r.precision)
        false_q.add_metric([r.rule], r.false_quarantines)
        gpu_hours.add_metric([r.rule], r.gpu_hours)
        if r.median_time_to_repair_seconds is not None:
            ttr.add_metric([r.rule], r.median_time_to_repair_seconds)
    shadow = GaugeMetricFamily(
        "healer_shadow_rule_decisions",
        "What a shadow rule would have done in the last 30 days, by outcome (confirmed, "
        "not_confirmed, pending).",
        labels=["rule", "outcome"],
    )
    shadow_gpu_hours = GaugeMetricFamily(
        "healer_shadow_rule_gpu_hours",
        "GPU-hours a shadow rule would have taken out of service in the last 30 days.",
        labels=["rule"],
    )
    for sr in oc.shadow_records(store.shadow_judged(session, since=since, now=now), since=since, now=now):
        counts = {"confirmed": sr.confirmed, "not_confirmed": sr.not_confirmed, "pending": sr.pending}
        for outcome, n in counts.items():
            shadow.add_metric([sr.rule, outcome], n)
        shadow_gpu_hours.add_metric([sr.rule], sr.gpu_hours)
    overdue = GaugeMetricFamily(
        "healer_tickets_overdue",
        "Open tickets past their provider's repair target (ack: not acknowledged in time, repair: "
        "not resolved in time; tickets.providers[].ack_within_seconds / repair_within_seconds).",
        labels=["provider", "target"],
    )
    for (provider, target), n in sorted(store.overdue_counts(session).items()):
        overdue.add_metric([provider, target], n)
    yield from (decisions, precision, false_q, gpu_hours, ttr, shadow, shadow_gpu_hours, overdue)


#: How far back the parts ledger's metrics look.
LEDGER_WINDOW = parts.DEFAULT_WINDOW


def _ledger_families(session: Session, now: datetime) -> Iterable[Metric]:
    """Repair outcomes per step and provider, repeat parts and time between failures
    (:mod:`healer.store.parts`), over :data:`LEDGER_WINDOW`."""
    book = parts.ledger(session, since=now - LEDGER_WINDOW)
    steps = GaugeMetricFamily(
        "healer_repair_steps",
        "Remediation ladder steps started in the last 90 days, by step, provider and outcome "
        "(succeeded: the node returned after it; escalated: it did not, or not yet).",
        labels=["step", "provider", "outcome"],
    )
    rate = GaugeMetricFamily(
        "healer_repair_success_ratio",
        "Share of a step's attempts after which the node returned.",
        labels=["step", "provider"],
    )
    for s in book.steps:
        steps.add_metric([s.step, s.provider, "succeeded"], float(s.succeeded))
        steps.add_metric([s.step, s.provider, "escalated"], float(s.attempts - s.succeeded))
        if s.success_rate is not None:
            rate.add_metric([s.step, s.provider], s.success_rate)
    yield steps
    yield rate
    repeat = GaugeMetricFamily(
        "healer_repeat_parts",
        "Parts (GPU UUID, HCA) that failed again after a repair, by kind.",
        labels=["kind"],
    )
    for kind in ("gpu", "hca"):
        repeat.add_metric([kind], float(sum(1 for p in book.parts if p.repeat and p.kind == kind)))
    yield repeat
    mtbf = GaugeMetricFamily(
        "healer_node_mean_time_between_failures_seconds",
        "Mean time between a node's failures (nodes that failed twice or more), seconds.",
        labels=["node"],
    )
    for node, seconds in sorted(book.node_mtbf().items()):
        mtbf.add_metric([node], seconds)
    yield mtbf
    part_gaps = [g for p in book.parts if (g := p.mean_time_between_failures_seconds) is not None]
    fleet = GaugeMetricFamily(
        "healer_part_mean_time_between_failures_seconds",
        "Mean over parts that failed twice or more of their mean time between failures, seconds.",
    )
    if part_gaps:
        fleet.add_metric([], sum(part_gaps) / len(part_gaps))
    yield fleet


class _WatchedStores(Collector):
    """``healer_watch_age_seconds`` and ``healer_watch_lists`` of watched stores, by resource."""

    def __init__(self, stores: dict[str, WatchedStore]) -> None:
        self.stores = stores

    def collect(self) -> Iterable[Metric]:
        age = GaugeMetricFamily(
            "healer_watch_age_seconds",
            "Seconds since a watched store last heard from the API server (an event, a bookmark, a "
            "new watch or a list), by resource; -1 before its first list and while its watch is down "
            "(its readers then list).",
            labels=["resource"],
        )
        lists = GaugeMetricFamily(
            "healer_watch_lists",
            "LIST requests a watched store made since start, by resource (the first, then one per "
            "expired resourceVersion).",
            labels=["resource"],
        )
        for resource, store in sorted(self.stores.items()):
            age.add_metric([resource], _or_minus_one(store.age_seconds()))
            lists.add_metric([resource], float(store.lists))
        yield age
        yield lists


class WatchedStore(Protocol):
    """A watched store's freshness, as :class:`healer.actions.node_watch.NodeWatch` reports it."""

    lists: int

    def age_seconds(self) -> float | None: ...


def _or_minus_one(value: float | None) -> float:
    return -1.0 if value is None else value


#: Most (rule, node) series of ``healer_blind_spots`` exported; the places total is always exact.
MAX_BLIND_SPOT_SERIES = 1000


def _blind_spot_families(session: Session) -> Iterable[Metric]:
    """The last blind-spot observation (:mod:`healer.blind_spots`), from its switch."""
    report = BlindReport.from_switch(repo.get_switch(session, repo.SWITCH_BLIND_SPOTS))
    if report is None:
        return
    per = GaugeMetricFamily(
        "healer_blind_spots",
        "GPUs, InfiniBand ports or whole nodes (scopes) of a node that a rule cannot see: the node "
        "lacks an input the rule reads while other targets export it. Never health.",
        labels=["rule", "node"],
    )
    for (rule, node), count in sorted(report.counts().items())[:MAX_BLIND_SPOT_SERIES]:
        per.add_metric([rule, node], float(count))
    yield per
    places = GaugeMetricFamily(
        "healer_blind_spot_places", "Blind spots in all (one per rule and scope), at the last observation."
    )
    places.add_metric([], float(report.found))
    yield places
    when = GaugeMetricFamily(
        "healer_blind_spots_observed_timestamp_seconds", "Unix time of the last blind-spot observation."
    )
    when.add_metric([], report.observed_at.timestamp())
    yield when


def _burst_families(session: Session) -> Iterable[Metric]:
    """The burst nodes as the burst job last observed them (the ``burst`` switch) and the pods it
    sent back (:mod:`healer.store.burst`)."""
    observed = repo.get_switch(session, burst_store.SWITCH_BURST)
    rules = observed.get("rules") or []
    returned = burst_store.returned(session)
    if not rules and not returned:
        return
    is_open = GaugeMetricFamily(
        "healer_burst_open",
        "1 while a burst node is open (healer's burst taint off), 0 closed.",
        labels=["rule", "node"],
    )
    pods = GaugeMetricFamily(
        "healer_burst_pods", "Pods on a burst node (out of the cluster).", labels=["rule", "node"]
    )
    stuck = GaugeMetricFamily(
        "healer_burst_pods_stuck",
        "Pods on a closed burst node that cannot come back (no in-cluster GPUs for them).",
        labels=["rule", "node"],
    )
    for rule in rules:
        for node in rule.get("nodes") or []:
            labels = [str(rule.get("rule", "")), str(node.get("node", ""))]
            is_open.add_metric(labels, 1.0 if node.get("state") == "open" else 0.0)
            pods.add_metric(labels, float(len(node.get("out") or [])))
            no_room = [w for w in (node.get("stay") or {}).values() if str(w).startswith("no capacity")]
            stuck.add_metric(labels, float(len(no_room)))
    back = CounterMetricFamily(
        "healer_burst_pods_returned",
        "Pods evicted off a closed burst node back into the cluster.",
        labels=["rule", "node"],
    )
    for (rule_name, node_name), count in sorted(returned.items()):
        back.add_metric([rule_name, node_name], float(count))
    yield from (is_open, pods, stuck, back)


def _state_families(session: Session) -> Iterable[Metric]:
    by_state = dict(session.execute(select(Node.state, func.count()).group_by(Node.state)).all())
    nodes = GaugeMetricFamily("healer_nodes", "Nodes by lifecycle state.", labels=["state"])
    for node_state in NodeState:
        nodes.add_metric([str(node_state)], float(by_state.get(str(node_state), 0)))
    yield nodes

    findings = GaugeMetricFamily(
        "healer_findings", "Pending and firing findings per rule (one per series).", labels=["rule", "state"]
    )
    for rule, state, count in session.execute(
        select(Finding.rule, Finding.state, func.count())
        .where(Finding.state.in_([FindingState.PENDING, FindingState.FIRING]))
        .group_by(Finding.rule, Finding.state)
    ):
        findings.add_metric([rule, state], float(count))
    yield findings

    breaker: dict[str, Any] = repo.get_switch(session, repo.SWITCH_BREAKER)
    tripped = GaugeMetricFamily("healer_breaker_tripped", "1 while the circuit breaker is tripped.")
    tripped.add_metric([], 1.0 if breaker.get("tripped") else 0.0)
    yield tripped
    held = GaugeMetricFamily("healer_breaker_held_nodes", "Nodes the tripped breaker holds back.")
    held.add_metric([], float(len(breaker.get("held", []) or []) if breaker.get("tripped") else 0))
    yield held

    blocked_since = session.execute(
        select(func.count(), func.min(Node.state_since))
        .join(Incident, (Incident.node_id == Node.id) & Incident.closed_at.is_(None))
        .where(Node.state == NodeState.BLOCKED, Incident.blocked_step == "drain")
    ).one()
    drain_blocked = GaugeMetricFamily(
        "healer_drain_blocked_nodes",
        "Nodes whose drain is blocked (PodDisruptionBudgets past the deadline, or refused pods).",
    )
    drain_blocked.add_metric([], float(blocked_since[0] or 0))
    yield drain_blocked
    oldest = GaugeMetricFamily(
        "healer_drain_blocked_oldest_timestamp_seconds",
        "Unix time since which the longest-blocked drain has been blocked (0 when none): alert on "
        "time() - this > your limit.",
    )
    oldest.add_metric([], blocked_since[1].timestamp() if blocked_since[1] is not None else 0.0)
    yield oldest

    yield from _blind_spot_families(session)

    paused = GaugeMetricFamily("healer_paused", "1 while an operator has paused healer.")
    paused.add_metric([], 1.0 if repo.get_switch(session, repo.SWITCH_PAUSED).get("paused") else 0.0)
    yield paused

    outbox = dict(
        session.execute(
            select(OutboxMessage.status, func.count())
            .where(OutboxMessage.status.in_([OutboxStatus.PENDING, OutboxStatus.FAILED]))
            .group_by(OutboxMessage.status)
        ).all()
    )
    depth = GaugeMetricFamily("healer_outbox_depth", "Ticket webhooks waiting to be delivered.")
    depth.add_metric([], float(outbox.get(OutboxStatus.PENDING, 0)))
    yield depth
    failed = GaugeMetricFamily(
        "healer_outbox_delivery_failures", "Ticket webhooks that failed permanently (kept for inspection)."
    )
    failed.add_metric([], float(outbox.get(OutboxStatus.FAILED, 0)))
    yield failed
    retrying = GaugeMetricFamily(
        "healer_outbox_retrying", "Pending ticket webhooks that failed at least once and will be retried."
    )
    retrying.add_metric(
        [],
        float(
            session.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(OutboxMessage.status == OutboxStatus.PENDING, OutboxMessage.attempts > 0)
            )
            or 0
        ),
    )
    yield retrying

    last_tick = repo.get_switch(session, repo.SWITCH_LAST_TICK)
    if last_tick.get("at"):
        when = GaugeMetricFamily(
            "healer_last_tick_timestamp_seconds", "Unix time of the last completed tick (any replica)."
        )
        when.add_metric([], datetime.fromisoformat(last_tick["at"]).timestamp())
        yield when
