"""The controller process behind ``healer run``: the jobs, leadership, and shutdown.

Jobs (APScheduler, each one at a time, ``coalesce=True`` so a slow run is not stacked):

* **lease**   every ``kubernetes.renew_interval_seconds``: acquire or renew the Lease.
* **tick**    every rule-group interval (the shortest one): detection → remediation → record;
  then single GPUs out or back (:mod:`healer.controller.gpu_isolation`). In alerts mode also
  on :meth:`Controller.wake` (Alertmanager's webhook): an early tick of every group at the clock's
  time, at most once per ``detection.wake_min_interval_seconds`` (:mod:`healer.controller.wake`);
  the scheduled ticks keep their grid.
* **drains**  every ``scheduler.drain_interval_seconds``: one step of every drain in progress.
* **outbox**  every ``scheduler.outbox_interval_seconds``: deliver due provider tickets.
* **rules**   every 2 s: reload rule files that changed (SIGHUP reloads at once).
* **kueue**   every ``kueue.interval_seconds`` when ``kueue.enabled``: the ClusterQueues' GPU
  quota follows healthy capacity (:mod:`healer.controller.quota_sync`).
* **burst**   every ``scheduler.burst_interval_seconds``: capacity rules open and close their burst
  nodes and send pods back at their pace (:mod:`healer.controller.burst`); nothing without one.
* **retention** hourly: prune rule evaluations and closed incidents' rows older than
  ``scheduler.retention_days``.

Only the leader ticks, drains and delivers; the others keep serving the dashboard and trying for
the Lease. A lost Lease stops acting at the next check: before each job, and before every cluster
write and every record (:mod:`healer.controller.fence`: also a newer leader's fencing number in
the database). Each tick begins its remediation with the ownership reconcile
(:mod:`healer.controller.ownership`), so the first tick after a start settles what a killed
process left half done.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

import httpx
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import NodeActions
from healer.actions.validation import Validator
from healer.blind_spots import observe_blind_spots
from healer.clock import MonotonicClock, utc_now
from healer.config import Settings
from healer.controller import domains, ownership, shadow
from healer.controller.backoff import Backoff
from healer.controller.burst import BurstSync
from healer.controller.fence import Fence, claim
from healer.controller.gpu_isolation import GpuIsolationSync
from healer.controller.passes import RemediationResult, advance_drains, remediate
from healer.controller.quota_sync import QuotaSync
from healer.controller.wake import Wakeups
from healer.coverage import observe_coverage
from healer.detection import DetectionResult, initial_state, run_detection
from healer.engine import gpu_scope
from healer.engine import shadow as engine_shadow
from healer.engine.evaluation import EvaluationState
from healer.engine.schedule import due_groups, tick_seconds
from healer.errors import HealerError, NotLeader
from healer.metrics import HealerMetrics
from healer.model.addresses import AddressBook
from healer.model.blind_spots import BlindReport
from healer.model.node import NodeView
from healer.model.source_health import SourceHealth, next_health
from healer.rules_holder import RulesHolder
from healer.ruleset.schema import RuleSet
from healer.sources.base import AlertStateSource, MetricsSource
from healer.store import nodes as repo
from healer.store.models import CallbackNonce, Incident, RuleEvaluation, Transition
from healer.store.session import transaction
from healer.tickets.coverage import describe, missing_providers
from healer.tickets.delivery import deliver_due
from healer.tickets.targets import escalate_overdue

log = logging.getLogger(__name__)


class Background(Protocol):
    """A thread the controller starts and stops with its jobs."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Leadership(Protocol):
    """What the controller needs of a leader elector (``healer.actions.lease.LeaderElector``)."""

    def try_acquire_or_renew(self, now: datetime) -> bool: ...

    def still_leader(self, now: datetime) -> bool: ...

    def release(self, now: datetime | None = None) -> None: ...

    #: Why this replica does not lead now ("held by X", "Lease API error: ..."), "" when it does.
    why_not: str
    #: The Lease's ``leaseTransitions`` as this replica last acquired or renewed it.
    fencing_token: int


def scheduled_tick_time(origin: datetime, period: float, clock_now: datetime) -> datetime:
    """The time the running tick was scheduled for: the latest ``origin + k * period`` (seconds)
    at or before ``clock_now``, allowing ``clock_now`` to read a little early.

    The tick evaluates at this time, not at the clock read: consecutive ticks are then exactly
    ``period`` apart, as Prometheus's rule evaluations are, so a ``for: 30s`` that became active at
    one tick is held at the tick 30 s later. Judged against clock reads, a later read that was a
    fraction of a millisecond "earlier" in its period than the first read waited a whole extra tick.
    The slack (half a period, at most 1 s) absorbs a scheduler that wakes slightly before its time;
    a tick that runs late (a long previous tick, coalesced runs) maps to the latest period it is in.
    """
    slack = min(1.0, period / 2)
    steps = math.floor(((clock_now - origin).total_seconds() + slack) / period)
    return origin + timedelta(seconds=max(steps, 0) * period)


@dataclass
class Controller:
    """One controller process. Build it in :mod:`healer.wiring`; call :meth:`start`, then :meth:`stop`."""

    settings: Settings
    session_factory: sessionmaker[Session]
    source: MetricsSource | AlertStateSource
    actions: NodeActions
    rules: RulesHolder
    leadership: Leadership
    #: Everything recorded and every duration (``for``, holds, deadlines) reads this clock; with
    #: replicas, one they share (:class:`healer.clock.SharedClock`, the database server's time).
    clock: Callable[[], datetime]
    metrics: HealerMetrics
    identity: str = "healer"
    fleet: Callable[[], dict[str, str] | None] = lambda: None
    #: Every node → its labels (for rules naming their pool by node labels), or None.
    node_labels: Callable[[], dict[str, dict[str, str]] | None] = lambda: None
    owned: Callable[[], list[NodeView]] = list
    #: A node read now when it still carries healer's marks (confirms a release by the ownership
    #: reconcile); None: ``owned``'s views are taken as read.
    owned_node: Callable[[str], NodeView | None] | None = None
    #: Threads started before the jobs and stopped after them (the node watch).
    background: Sequence[Background] = ()
    #: The cluster's node and exporter pod names and addresses, which check the node each series
    #: names (and name it by ``instance`` when it has no node label); None = labels as they are.
    addresses: Callable[[], AddressBook] | None = None
    #: The names of the cluster's GPU nodes (a GPU node exporting no dcgm-exporter series is
    #: blind), or None: not known (:mod:`healer.blind_spots`).
    gpu_nodes: Callable[[], list[str]] | None = None
    validator: Validator | None = None  # validation Jobs (validation.enabled; recorded only in dry-run)
    #: The Kueue quota sync (``kueue.enabled``), run by its own job; None: off.
    quota_sync: QuotaSync | None = None
    #: Takes single GPUs out for rules with ``quarantine: {scope: gpu}`` (each tick); None: off.
    gpu_isolation: GpuIsolationSync | None = None
    #: The capacity rules' burst job, run by its own job; None: off.
    burst: BurstSync | None = None
    #: The topology file's node → {kind: domain} (``topology.file``), beside the nodes' labels.
    topology_file: Mapping[str, Mapping[str, str]] | None = None
    http: httpx.Client = field(default_factory=lambda: httpx.Client(follow_redirects=False))
    state: EvaluationState = field(default_factory=EvaluationState)
    #: This replica's own clock for leader election (client-go times the Lease's observed changes
    #: on the reader's clock); it must not jump, only its differences are used.
    lease_clock: Callable[[], datetime] = field(default_factory=MonotonicClock)
    _leader: bool = False
    _group_last: dict[str, datetime] = field(default_factory=dict)
    _tick_seconds: float = 0.0
    #: Start of the tick's schedule (set by :meth:`start` and on a reschedule); None = tick at the
    #: clock's time (a tick called directly, as tests do).
    _tick_origin: datetime | None = None
    _why_not: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _scheduler: BackgroundScheduler | None = None
    #: Early ticks on request (alerts mode, started by :meth:`start`); None: :meth:`wake` is off.
    _wakeups: Wakeups | None = None
    #: The evaluation times of the last tick and of the last early tick. Ticks never go back in
    #: time: an early tick runs at the clock's time, no earlier than the last tick (which may have
    #: run at a grid time a little ahead of the clock), and a scheduled tick no earlier than it.
    _last_now: datetime | None = None
    #: The topology this replica last wrote to the ``topology`` switch (None: not yet).
    _topology_written: dict[str, dict[str, str]] | None = None
    _woken_at: datetime | None = None
    _backoff: Backoff = field(default_factory=Backoff)
    #: The rules' coverage (rule → nodes exporting its input metrics), when it was observed, and
    #: for which rule set (a reload observes again).
    _coverage: dict[str, frozenset[str]] = field(default_factory=dict)
    _coverage_at: datetime | None = None
    _coverage_rules: object = None

    # -- leadership ------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this replica holds the Lease (re-read at each call: it can change mid-tick)."""
        return self._leader and self.leadership.still_leader(self.lease_clock())

    def fence(self) -> Fence:
        """This replica's fence: its identity, the Lease's fencing number, and :meth:`is_leader`."""
        return Fence(holder=self.identity, token=self.leadership.fencing_token, leading=self.is_leader)

    def keep_lease(self) -> None:
        """Acquire or renew the Lease; a newly won leadership resumes from the database."""
        now = self.clock()
        try:
            won = self.leadership.try_acquire_or_renew(self.lease_clock())
        except HealerError as exc:
            log.error("lease renewal failed: %s", exc)
            won = False
        why_not = "" if won else self.leadership.why_not or "not the leader"
        if why_not and why_not != self._why_not:
            # Said once per change: a standby is normal, an unreachable API server is not.
            log.warning("standing by, not acting: %s", why_not)
        self._why_not = why_not
        if won and not self._leader:
            with self._lock:
                with transaction(self.session_factory) as session:
                    won = claim(session, self.fence(), now=now)
                if won:
                    log.info("became leader", extra={"identity": self.identity})
                    self.state = initial_state(self.session_factory)
                else:
                    log.error(
                        "the database records a leader with a larger fencing number than this "
                        "Lease's leaseTransitions (%d); standing by. If the Lease was deleted and "
                        "recreated, delete the 'leader' row of the switches table to start over",
                        self.leadership.fencing_token,
                    )
        elif self._leader and not won:
            log.warning("lost leadership; stopping all actions", extra={"identity": self.identity})
        self._leader = won

    # -- jobs --------------------------------------------------------------------------------------

    def wake(self) -> bool:
        """Ask for an early tick (alerts mode: Alertmanager says an alert of healer's changed).

        Returns at once: True when a tick will run soon (coalesced with other requests, at most one
        per ``detection.wake_min_interval_seconds``), False when it will not: this replica does not
        lead, or the controller is not running in alerts mode. The tick reads Prometheus as any
        tick does; nothing from the request goes into it.
        """
        if self._wakeups is None or not self.is_leader():
            return False
        self._wakeups.request()
        return True

    def _woken_tick(self) -> None:
        self.tick(woken=True)

    def tick(self, *, woken: bool = False) -> None:
        """One evaluation tick: query → evaluate → advance lifecycles → act → record.

        ``woken`` (an early tick, :meth:`wake`): every group at the clock's time, and the groups'
        schedule is left as it is, so the scheduled ticks still run on time.
        """
        if not self.is_leader():
            return
        with self._lock:
            started = self.clock()
            now = started
            if not woken and self._tick_origin is not None and self._tick_seconds > 0:
                now = scheduled_tick_time(self._tick_origin, self._tick_seconds, started)
            if woken:
                now = self._woken_at = max(now, self._last_now or now)
            elif self._woken_at is not None:
                now = max(now, self._woken_at)
            self._last_now = now
            ruleset = self.rules.ruleset
            due = (
                {g.name for g in ruleset.groups}
                if woken
                else due_groups(
                    ruleset.groups,
                    self._group_last,
                    now,
                    default_interval=self.settings.scheduler.default_interval_seconds,
                    tick_seconds=self._tick_seconds,
                )
            )
            ok = True
            try:
                detection = run_detection(
                    ruleset=ruleset,
                    source=self.source,
                    session_factory=self.session_factory,
                    state=self.state,
                    now=now,
                    due_groups=due,
                    concurrency=self.settings.prometheus.max_concurrent_queries,
                    addresses=self.addresses,
                )
                self.state = detection.state
                if not woken:
                    self._group_last.update(dict.fromkeys(due, now))
                self._record_source(detection, now)
                for report in detection.reports:
                    self.metrics.set_rule_health(
                        report.rule, str(report.health), evaluated_at_unix=now.timestamp()
                    )
                    self.metrics.count_cleaned(report.rule, report.cleaned)
                    self.metrics.set_unresolved(report.rule, report.unresolved)
                if not self.is_leader():
                    return
                # Shadow rules record what they would do and act on nothing.
                shadow.record(
                    findings=detection.findings,
                    rules=ruleset,
                    reports=detection.reports,
                    sessions=self.session_factory,
                    now=now,
                    fence=self.fence(),
                    actions=self.actions,
                )
                acting = engine_shadow.acting(detection.findings, ruleset)
                # Findings contained to one GPU (rules with quarantine scope gpu) stay off the node.
                node_findings = gpu_scope.for_nodes(acting, ruleset)
                ownership.settle(
                    owned=self.owned,
                    confirm=self.owned_node,
                    actions=self.actions,
                    sessions=self.session_factory,
                    findings=node_findings,
                    now=now,
                    fence=self.fence(),
                )
                result = remediate(
                    findings=node_findings,
                    rules=ruleset,
                    actions=self.actions,
                    session_factory=self.session_factory,
                    settings=self.settings,
                    now=now,
                    fleet=self._fleet(),
                    backoff=self._backoff,
                    fence=self.fence(),
                    coverage=self._observe_coverage(ruleset, now),
                    node_labels=self._node_labels(ruleset),
                    validator=self.validator,
                    topology=(topology := self._topology()),
                )
                self._remember_topology(topology, now)
                self._count(result)
                if self.gpu_isolation is not None:
                    self.gpu_isolation.run(acting, ruleset, now, fence=self.fence())
                changed = [o for o in result.outcomes if o.to_state and o.to_state != o.from_state]
                if changed:
                    log.info(
                        "tick moved %d node(s)",
                        len(changed),
                        extra={"nodes": {o.node: f"{o.from_state}->{o.to_state}" for o in changed}},
                    )
            except NotLeader as exc:
                ok = False
                log.warning("stopped mid-tick, nothing more written: %s", exc)
            except Exception:
                ok = False  # recorded below; the job wrapper logs the traceback once
                raise
            finally:
                duration = (self.clock() - started).total_seconds()
                self.metrics.observe_tick(duration_seconds=duration, ok=ok)
                if self.is_leader():  # a replica that stopped leading records nothing
                    self._record_tick(now, duration, ok)

    def _record_tick(self, now: datetime, duration: float, ok: bool) -> None:
        with transaction(self.session_factory) as session:
            repo.set_switch(
                session,
                repo.SWITCH_LAST_TICK,
                {"at": now.isoformat(), "duration_seconds": duration, "leader": self.identity, "ok": ok},
                now=now,
                by=self.identity,
            )

    def _record_source(self, detection: DetectionResult, now: datetime) -> None:
        """Record whether the source answered this tick (the ``source`` switch, read by /readyz and
        the fleet page); log one line when that changes, with the reason."""
        if not detection.reports:
            return  # nothing was due: the tick says nothing about the source
        failure = None
        if detection.source_unavailable:
            failure = next((r.error for r in detection.reports if r.error), "no rule could be queried")
        with transaction(self.session_factory) as session:
            previous = SourceHealth.from_switch(repo.get_switch(session, repo.SWITCH_SOURCE))
            health = next_health(previous, failure=failure, now=now)
            repo.set_switch(session, repo.SWITCH_SOURCE, health.as_switch(), now=now, by=self.identity)
        if previous is not None and previous.ok == health.ok:
            return
        if not health.ok:
            log.error(
                "prometheus cannot be queried, no rule is evaluated: %s (unready after %.0fs)",
                health.reason,
                self.settings.prometheus.unavailable_grace_seconds,
            )
        elif previous is not None:
            log.warning("prometheus answers again after %.0fs", (now - previous.since).total_seconds())

    def _count(self, result: RemediationResult) -> None:
        """Count each node step by kind and result for /metrics (the backoff logs failures once)."""
        for o in result.outcomes:
            if not o.step:
                continue
            outcome = "refused" if o.refused else "failed" if o.error else "succeeded"
            self.metrics.count_action(o.step, outcome)
        self.metrics.set_domains(
            self.settings.topology.kinds(),
            {node: (f.kind, f.id) for node, f in result.domains.facts.items()},
        )

    def _observe_coverage(self, ruleset: RuleSet, now: datetime) -> dict[str, frozenset[str]]:
        """The rules' coverage, observed again every ``safety.coverage_refresh_seconds`` or when
        the rule set changed; the last good observation stands for a rule whose query failed."""
        due = (
            self._coverage_at is None
            or self._coverage_rules is not ruleset
            or (now - self._coverage_at).total_seconds() >= self.settings.safety.coverage_refresh_seconds
        )
        if due and isinstance(self.source, MetricsSource):  # alerts mode's source also queries
            book = None
            try:
                book = self.addresses() if self.addresses is not None else None
            except HealerError as exc:
                log.warning("coverage: cluster addresses unread (labels taken as they are): %s", exc)
            observed = observe_coverage(ruleset=ruleset, source=self.source, now=now, book=book)
            keep = {r: nodes for r, nodes in self._coverage.items() if self._coverage_rules is ruleset}
            self._coverage = {**keep, **observed}
            self._coverage_at, self._coverage_rules = now, ruleset
        return self._coverage

    def blind_spots(self) -> None:
        """Observe every rule's blind spots (:mod:`healer.blind_spots`) and store them in the
        ``blind_spots`` switch for the dashboard, the API and ``/metrics``; log one line when their
        number changes. Its own job, every ``safety.coverage_refresh_seconds``, leader only: its
        queries never hold a tick (nor the tick's lock: it writes only its switch)."""
        if not self.is_leader() or not isinstance(self.source, MetricsSource):
            return  # alerts mode's source also queries; a standby records nothing
        now, ruleset = self.clock(), self.rules.ruleset
        book = gpu_nodes = None
        try:
            book = self.addresses() if self.addresses is not None else None
        except HealerError as exc:
            log.warning("blind spots: cluster addresses unread (labels taken as they are): %s", exc)
        try:
            gpu_nodes = self.gpu_nodes() if self.gpu_nodes is not None else None
        except HealerError as exc:
            log.warning("blind spots: the cluster's GPU nodes could not be listed: %s", exc)
        report = observe_blind_spots(
            ruleset=ruleset, source=self.source, now=now, book=book, gpu_nodes=gpu_nodes
        )
        with transaction(self.session_factory) as session:
            before = BlindReport.from_switch(repo.get_switch(session, repo.SWITCH_BLIND_SPOTS))
            repo.set_switch(session, repo.SWITCH_BLIND_SPOTS, report.as_switch(), now=now, by=self.identity)
        if before is not None and before.found == report.found:
            return
        nodes = report.by_node()
        if report.spots:
            log.warning(
                "blind spots: %d place(s) on %d node(s) where a rule cannot see",
                report.found,
                len(nodes),
                extra={"nodes": {n: sorted({x.rule for x in f}) for n, f in list(nodes.items())[:20]}},
            )
        else:
            log.info("blind spots: none")

    def _remember_topology(self, topology: dict[str, dict[str, str]] | None, now: datetime) -> None:
        """Write the ``topology`` switch (kind → domain → nodes) when it changed since this
        replica last wrote it (the dashboard's topology page reads it)."""
        if topology is None or topology == self._topology_written:
            return
        value: dict[str, dict[str, list[str]]] = {}
        for node, of in sorted(topology.items()):
            for kind, name in of.items():
                value.setdefault(kind, {}).setdefault(name, []).append(node)
        with transaction(self.session_factory) as session:
            self.fence().check_db(session)
            repo.set_switch(session, repo.SWITCH_TOPOLOGY, {"domains": value}, now=now, by=self.identity)
        self._topology_written = topology

    def _topology(self) -> dict[str, dict[str, str]] | None:
        """node → {kind: domain} from the nodes' labels and the topology file (None: correlation
        off, or the labels cannot be listed now)."""
        if not self.settings.topology.kinds():
            return None
        try:
            labels = self.node_labels()
        except HealerError as exc:
            log.warning("cannot list node labels (no domain correlation this tick): %s", exc)
            return None
        if labels is None:
            return None
        topology = domains.topology_of(labels, self.settings.topology, self.topology_file)
        return {node: dict(of) for node, of in topology.items()}

    def _node_labels(self, ruleset: RuleSet) -> dict[str, dict[str, str]] | None:
        """Every node's labels when a rule names its pool by them, else None (no list call)."""
        if not ruleset.pools():
            return None
        try:
            return self.node_labels()
        except HealerError as exc:
            log.warning("cannot list node labels (named pools fall back to labelled pools): %s", exc)
            return None

    def _fleet(self) -> dict[str, str] | None:
        """The cluster's nodes and pools, or None when they cannot be listed now (logged)."""
        try:
            return self.fleet()
        except HealerError as exc:
            log.warning("cannot list the cluster's nodes; budgets use the nodes healer knows: %s", exc)
            return None

    def drains(self) -> None:
        """One step of every drain in progress (resumed from the database after a restart)."""
        if not self.is_leader():
            return
        with self._lock:
            try:
                result = advance_drains(
                    rules=self.rules.ruleset,
                    actions=self.actions,
                    session_factory=self.session_factory,
                    settings=self.settings,
                    now=self.clock(),
                    backoff=self._backoff,
                    fence=self.fence(),
                )
            except NotLeader as exc:
                log.warning("stopped mid-drain pass, nothing more written: %s", exc)
                return
            self._count(result)

    def kueue(self) -> None:
        """Keep the managed ClusterQueues' GPU quota in step with healthy capacity (leader only)."""
        if self.quota_sync is None or not self.is_leader():
            return
        with self._lock:
            try:
                self.quota_sync.run(self.clock(), fence=self.fence())
            except NotLeader as exc:
                log.warning("stopped mid quota sync, nothing more written: %s", exc)

    def bursts(self) -> None:
        """Capacity rules: open or close their burst nodes, and send pods back (leader only; its own
        job, beside the tick; it takes the tick's lock only for its writes' ordering)."""
        capacity = self.rules.ruleset.capacity
        if self.burst is None or not capacity or not self.is_leader():
            return
        with self._lock:
            try:
                self.burst.run(capacity, self.clock(), fence=self.fence())
            except NotLeader as exc:
                log.warning("stopped mid burst run, nothing more written: %s", exc)

    def outbox(self) -> None:
        """Deliver due provider tickets; never blocks a tick (its own job and transactions)."""
        if not self.is_leader():
            return
        with transaction(self.session_factory) as session:
            self.fence().check_db(session)
            escalate_overdue(session, tickets=self.settings.tickets, now=self.clock())
        report = deliver_due(
            session_factory=self.session_factory, settings=self.settings, now=self.clock(), client=self.http
        )
        if report.delivered or report.failed:
            log.info(
                "tickets delivered=%d retrying=%d failed=%d", report.delivered, report.retrying, report.failed
            )

    def retention(self) -> None:
        """Delete rule evaluations, old transitions of closed incidents and spent callback nonces."""
        if not self.is_leader():
            return
        now = self.clock()
        cutoff = now - timedelta(days=self.settings.scheduler.retention_days)
        with transaction(self.session_factory) as session:
            session.execute(delete(RuleEvaluation).where(RuleEvaluation.evaluated_at < cutoff))
            closed = select(Incident.id).where(Incident.closed_at.is_not(None), Incident.closed_at < cutoff)
            session.execute(delete(Transition).where(Transition.incident_id.in_(closed)))
            skew = timedelta(seconds=self.settings.tickets.max_clock_skew_seconds * 2)
            session.execute(delete(CallbackNonce).where(CallbackNonce.received_at < now - skew))

    def reload_rules(self) -> None:
        """Reload changed rule files; a new shortest group interval reschedules the tick."""
        if not self.rules.reload_if_changed():
            return
        every = tick_seconds(self.rules.ruleset.groups, self.settings.scheduler.default_interval_seconds)
        if every != self._tick_seconds and self._scheduler is not None:
            self._tick_seconds = every
            self._tick_origin = self.clock()
            self._scheduler.reschedule_job("tick", trigger="interval", seconds=every)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background threads (the node watch), take the Lease if free, then start the
        jobs in a background scheduler."""
        for thread in self.background:
            thread.start()
        self.keep_lease()
        s = self.settings
        tick_every = self._tick_seconds = tick_seconds(
            self.rules.ruleset.groups, s.scheduler.default_interval_seconds
        )
        scheduler = BackgroundScheduler(timezone="UTC", job_defaults={"coalesce": True, "max_instances": 1})
        started = self.clock()
        self._tick_origin = started
        jobs: list[tuple[Callable[[], None], float]] = [
            (self.keep_lease, s.kubernetes.renew_interval_seconds),
            (self.tick, tick_every),
            (self.drains, s.scheduler.drain_interval_seconds),
            (self.outbox, s.scheduler.outbox_interval_seconds),
            (self.reload_rules, 2.0),
            (self.retention, 3600.0),
            (self.blind_spots, s.safety.coverage_refresh_seconds),
            (self.bursts, s.scheduler.burst_interval_seconds),
        ]
        if self.quota_sync is not None:
            jobs.append((self.kueue, s.kueue.interval_seconds))
        for func, seconds in jobs:
            scheduler.add_job(
                _guarded(func),
                "interval",
                seconds=seconds,
                id=func.__name__,
                # APScheduler times its jobs on this machine's wall clock, not on the shared one
                # (which may be minutes apart): "now" in its own terms runs them at once.
                next_run_time=utc_now(),
                misfire_grace_time=max(1, int(seconds)),
            )
        scheduler.start()
        self._scheduler = scheduler
        if s.detection.mode == "alerts":
            self._wakeups = Wakeups(self._woken_tick, min_interval=s.detection.wake_min_interval_seconds)
            self._wakeups.start()
        ruleset = self.rules.ruleset
        log.info(
            "controller started: %d rules in %d groups, Prometheus %s, %s",
            len(ruleset.rules),
            len(ruleset.groups),
            s.prometheus.url,
            "DRY-RUN (records what it would do, changes nothing)" if s.safety.dry_run else "acting",
            extra={"identity": self.identity, "tick_seconds": tick_every, "dry_run": s.safety.dry_run},
        )
        for missing in missing_providers(ruleset.rules, s.tickets):
            log.error("%s: its tickets will be recorded but never delivered", describe(missing))

    def stop(self) -> None:
        """Graceful shutdown: let the running job finish its step, then hand the Lease over."""
        if self._wakeups is not None:
            self._wakeups.stop()
            self._wakeups = None
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        for thread in self.background:
            thread.stop()
        if self._leader:
            try:
                self.leadership.release(self.lease_clock())
            except HealerError as exc:
                log.warning("could not release the lease: %s", exc)
            self._leader = False
        self.http.close()
        bind = self.session_factory.kw.get("bind")
        if bind is not None:
            bind.dispose()
        log.info("controller stopped", extra={"identity": self.identity})


def _guarded(func: Callable[[], None]) -> Callable[[], None]:
    """A job that logs its failure and lets the next run try again (a bug is logged with its traceback)."""

    def run() -> None:
        try:
            func()
        except Exception:
            log.exception("job %s failed", func.__name__)

    run.__name__ = func.__name__
    return run
