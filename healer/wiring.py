"""The composition root: builds every adapter from the settings, and the clock.

Nothing else in healer reads the clock or chooses an implementation: dry-run is decided here
(``RecordingNodeActions`` instead of ``KubernetesNodeActions``), not by ``if`` statements in callers.
The commands in :mod:`healer.cli` call it; with the CLI it is the only place that imports ``api``.

    utc_now             the clock
    engine, sessions    the configured database (``database`` also checks or migrates the schema)
    prometheus_source   the detection source
    node_actions        the Kubernetes adapter, or its dry-run recorder
    address_lookup      the cluster's Node and exporter pod names and addresses (a series' node)
    gpu_isolation       single GPUs out (DRA DeviceTaintRule or node annotation), or its recorder
    quota_sync          the Kueue quota sync (``kueue.enabled``), or its dry-run recorder
    burst_sync          the capacity rules' burst job (its port, or its dry-run recorder)
    dashboard           the FastAPI app with its chart source, metrics and clock
    build_process       the controller and its dashboard (``healer run``, the demo)
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, make_url
from sqlalchemy.orm import Session, sessionmaker

from healer.clock import utc_now as utc_now  # re-exported: the one clock, for the CLI
from healer.config import Settings
from healer.errors import StoreError
from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from healer.tickets.coverage import refuse_acting_without_providers

# The adapters, the controller and the dashboard are imported where they are built, so that an
# operator command (``healer node list``) loads neither the Kubernetes client nor the web framework.
if TYPE_CHECKING:
    from fastapi import FastAPI
    from kubernetes.client import ApiClient

    from healer.actions.base import NodeActions
    from healer.actions.gpu_isolation import IsolationPort
    from healer.actions.kubernetes import KubernetesNodeActions
    from healer.actions.node_watch import NodeWatch
    from healer.actions.pod_watch import BudgetWatch, PodWatch
    from healer.actions.validation import Validator
    from healer.controller import Controller
    from healer.controller.burst import BurstSync
    from healer.controller.gpu_isolation import GpuIsolationSync
    from healer.controller.quota_sync import QuotaSync
    from healer.metrics import HealerMetrics
    from healer.model.addresses import AddressBook
    from healer.ruleset.schema import RuleSet
    from healer.sources.prometheus import PrometheusSource
    from healer.sources.prometheus_range import PrometheusRange


def topology_file(settings: Settings) -> dict[str, dict[str, str]] | None:
    """The topology file's node → {kind: domain} (``topology.file``), read once at start; None
    without one. Raises ConfigError naming the file and field. Logs one warning naming the enabled
    domain kinds whose ticket provider is not configured (their domain tickets would fail)."""
    configured = {p.name for p in settings.tickets.providers}
    missing = [
        f"{kind} ({k.provider})"
        for kind, k in settings.topology.kinds().items()
        if k.provider not in configured
    ]
    if missing and configured and not settings.safety.dry_run:
        logging.getLogger(__name__).warning(
            "domain kinds whose topology.<kind>.provider is not in tickets.providers (their domain "
            "tickets would fail): %s",
            ", ".join(missing),
        )
    path = settings.topology.file
    if path is None or not settings.topology.enabled:
        return None
    from healer.topology import load_file

    return load_file(path, frozenset(settings.topology.kinds()))


def default_identity() -> str:
    """This replica's name for the Lease: the pod name in a cluster (``HOSTNAME``), else host+pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


#: The chart's range queries must not hold a page for the full detection timeout (seconds).
CHART_TIMEOUT_SECONDS = 3.0


def engine(settings: Settings) -> Engine:
    """An engine on the configured database (``database.url``, ``database.echo``)."""
    return make_engine(settings.database.url, echo=settings.database.echo)


def has_table(engine: Engine, name: str) -> bool:
    """Whether the database behind ``engine`` has table ``name`` (is the schema there?)."""
    return inspect(engine).has_table(name)


def _missing_schema(url: str) -> StoreError:
    shown = make_url(url).render_as_string(hide_password=True)
    return StoreError(f"the database has no healer schema; create it with `healer db upgrade` ({shown})")


def _sqlite_without_schema(url: str) -> bool:
    """Whether ``url`` names an SQLite file that is missing or has no healer schema, checked
    read-only: connecting through the engine would create the file and switch it to WAL."""
    parsed = make_url(url)
    path = parsed.database or ""
    if not parsed.drivername.startswith("sqlite") or path in ("", ":memory:") or path.startswith("file:"):
        return False
    if not Path(path).is_file():
        return True
    try:
        with closing(sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)) as conn:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
            ).fetchone()
    except sqlite3.DatabaseError:
        return False  # not readable this way: the engine's own check below reports it
    return found is None


def schema_engine(settings: Settings) -> Engine:
    """An engine on the configured database, which must already hold healer's schema.

    An SQLite file without the schema is neither created nor written to (no empty ``healer.db``
    is left behind).

    Raises:
        StoreError: the schema is missing; the message says to run ``healer db upgrade``.
    """
    if _sqlite_without_schema(settings.database.url):
        raise _missing_schema(settings.database.url)
    bound = engine(settings)
    if not has_table(bound, "alembic_version"):
        bound.dispose()
        raise _missing_schema(settings.database.url)
    return bound


def sessions(settings: Settings) -> sessionmaker[Session]:
    """Sessions on the configured database for operator commands (``healer pause``, ``node list``...).

    Raises:
        StoreError: the schema is missing (see :func:`schema_engine`); nothing is created.
    """
    return make_sessionmaker(schema_engine(settings))


def database(settings: Settings, *, upgrade: bool = False) -> sessionmaker[Session]:
    """Sessions on the configured database; with ``upgrade`` the schema is migrated first.

    Raises:
        StoreError: the schema is missing (run ``healer db upgrade``).
    """
    if upgrade:
        migrate.upgrade(settings.database.url)
    return make_sessionmaker(schema_engine(settings))


def prometheus_source(settings: Settings) -> PrometheusSource:
    """The detection source on ``prometheus.url`` with its timeouts (close it): instant queries,
    or with ``detection.mode: alerts`` the alerts of the rules Prometheus evaluates."""
    from healer.sources.prometheus import PrometheusSource

    if settings.detection.mode == "alerts":
        from healer.sources.alerts import PrometheusAlertsSource

        return PrometheusAlertsSource.from_settings(settings.prometheus, settings.detection)
    return PrometheusSource.from_settings(settings.prometheus)


def node_actions(
    settings: Settings,
    api_client: ApiClient,
    sessions: sessionmaker[Session],
    *,
    identity: str,
    clock: Callable[[], datetime],
    node_watch: NodeWatch | None = None,
    pod_watch: PodWatch | None = None,
    budget_watch: BudgetWatch | None = None,
) -> tuple[KubernetesNodeActions, NodeActions]:
    """The cluster adapter, and what the controller acts through: the same adapter, or with
    ``safety.dry_run`` a recorder that writes what it would do to the database and touches nothing.
    ``node_watch``: the watched store the adapter reads the cluster's Nodes from (None: it lists);
    ``pod_watch``, ``budget_watch``: those a drain reads pods and PodDisruptionBudgets from.
    """
    from healer.actions.dryrun import RecordingNodeActions
    from healer.actions.kubernetes import KubernetesNodeActions

    cluster = KubernetesNodeActions(
        api_client,
        settings.kubernetes,
        identity=identity,
        clock=clock,
        node_watch=node_watch,
        pod_watch=pod_watch,
        budget_watch=budget_watch,
    )
    if settings.safety.dry_run:
        return cluster, RecordingNodeActions(cluster, sessions, clock=clock)
    return cluster, cluster


def address_lookup(settings: Settings) -> Callable[[], AddressBook]:
    """Reads the cluster's address book (:class:`~healer.actions.addresses.KubernetesAddresses`)
    for ``healer evaluate`` and ``healer backtest``: the Kubernetes configuration is loaded at the
    first call, so a tick whose rules return no series needs no cluster. Raises ``ConfigError`` (no usable
    configuration) or ``KubernetesError`` from the call."""
    from healer.actions.addresses import KubernetesAddresses
    from healer.actions.kubernetes import make_api_client

    def lookup() -> AddressBook:
        api_client = make_api_client(settings.kubernetes)
        try:
            return KubernetesAddresses(api_client, settings.kubernetes).address_book()
        finally:
            api_client.close()

    return lookup


def dashboard(
    settings: Settings,
    sessions: sessionmaker[Session],
    *,
    clock: Callable[[], datetime] = utc_now,
    ruleset_provider: Callable[[], RuleSet | None] | None = None,
    leader_provider: Callable[[], bool] | None = None,
    metrics: HealerMetrics | None = None,
    prometheus: PrometheusRange | None = None,
    history: PrometheusRange | None = None,
    controller_in_process: bool = False,
    wake: Callable[[], bool] | None = None,
) -> FastAPI:
    """The dashboard and API app, with its chart source (unless given: range queries on
    ``settings.prometheus``, each at most :data:`CHART_TIMEOUT_SECONDS`), its history source for
    the Rules page's backtest (unless given: range queries on ``settings.prometheus`` with its own
    ``timeout_seconds``) and a metrics registry (a fresh one unless given).
    ``controller_in_process``: ``healer run`` (its readiness follows the controller's ticks);
    ``wake``: its controller's early tick, for Alertmanager's webhook."""
    from api.app import create_app
    from healer.metrics import HealerMetrics
    from healer.sources.prometheus_range import PrometheusRange

    charts = prometheus or PrometheusRange(
        settings.prometheus.url,
        timeout_seconds=min(settings.prometheus.timeout_seconds, CHART_TIMEOUT_SECONDS),
        headers=settings.prometheus.headers,
        verify_tls=settings.prometheus.verify_tls,
    )
    p = settings.prometheus
    history = history or PrometheusRange(
        p.url, timeout_seconds=p.timeout_seconds, headers=p.headers, verify_tls=p.verify_tls
    )
    return create_app(
        settings,
        sessions,
        clock=clock,
        prometheus=charts,
        history=history,
        metrics=metrics or HealerMetrics(),
        ruleset_provider=ruleset_provider,
        leader_provider=leader_provider,
        controller_in_process=controller_in_process,
        wake=wake,
    )


def quota_sync(
    settings: Settings,
    api_client: ApiClient,
    sessions: sessionmaker[Session],
    cluster: KubernetesNodeActions,
    isolation: IsolationPort | None = None,
    metrics: HealerMetrics | None = None,
) -> QuotaSync | None:
    """The Kueue quota sync when ``kueue.enabled`` (None otherwise); with ``safety.dry_run`` it
    records the quota it would set and applies nothing. The GPUs ``isolation`` has out are not
    healthy capacity; ``metrics`` shows each quota and capacity."""
    if not settings.kueue.enabled:
        return None
    from healer.actions.kueue import DryRunKueueQuotas, KueueQuotas
    from healer.controller.quota_sync import QuotaSync, count_out

    k = settings.kueue
    real = KueueQuotas(
        api_client,
        resource=k.resource,
        field_manager=k.field_manager,
        request_timeout=settings.kubernetes.request_timeout_seconds,
    )
    quotas = DryRunKueueQuotas(real) if settings.safety.dry_run else real
    return QuotaSync(
        settings=k,
        quotas=quotas,
        nodes=cluster.list_nodes,
        sessions=sessions,
        domain=settings.kubernetes.domain,
        gpus_out=count_out(isolation) if isolation is not None else dict,
        metrics=metrics,
    )


def burst_sync(
    settings: Settings,
    api_client: ApiClient,
    sessions: sessionmaker[Session],
    cluster: KubernetesNodeActions,
    *,
    pod_watch: PodWatch | None = None,
    budget_watch: BudgetWatch | None = None,
) -> BurstSync:
    """The capacity rules' burst job (it does nothing while no capacity rule is enabled); with
    ``safety.dry_run`` it records the toggles and returns it would make and changes nothing.
    Pods and PodDisruptionBudgets come from the watches when given (else a list each read)."""
    from healer.actions.burst import DryRunBurst, KubernetesBurst
    from healer.actions.kueue import KueueQuotas
    from healer.controller.burst import BurstSync

    timeout = settings.kubernetes.request_timeout_seconds
    real = KubernetesBurst(
        api_client,
        domain=settings.kubernetes.domain,
        request_timeout=timeout,
        pod_watch=pod_watch,
        budget_watch=budget_watch,
    )
    kueue = KueueQuotas(api_client, request_timeout=timeout)
    return BurstSync(
        port=DryRunBurst(real) if settings.safety.dry_run else real,
        nodes=cluster.list_nodes,
        sessions=sessions,
        domain=settings.kubernetes.domain,
        kueue_pending=kueue.pending_workloads,
    )


def gpu_isolation(
    settings: Settings,
    api_client: ApiClient,
    sessions: sessionmaker[Session],
    *,
    events: NodeActions | None = None,
    metrics: HealerMetrics | None = None,
) -> GpuIsolationSync:
    """Single GPUs out for rules with ``quarantine: {scope: gpu}``: a DRA DeviceTaintRule or a node
    annotation (``gpu_isolation``); with ``safety.dry_run`` it records what it would take out.
    Each change is an Event on the node through ``events``, and ``metrics`` counts the GPUs out."""
    from healer.actions.gpu_isolation import DryRunGpuIsolation, GpuIsolation
    from healer.controller.gpu_isolation import GpuIsolationSync

    real = GpuIsolation(
        api_client,
        settings.gpu_isolation,
        domain=settings.kubernetes.domain,
        request_timeout=settings.kubernetes.request_timeout_seconds,
    )
    return GpuIsolationSync(
        isolation=DryRunGpuIsolation(real) if settings.safety.dry_run else real,
        sessions=sessions,
        events=events,
        metrics=metrics,
    )


@dataclass
class Process:
    """A built controller process: the controller and the dashboard app it serves."""

    controller: Controller
    app: FastAPI


def validation_jobs(settings: Settings, api_client: ApiClient, actions: NodeActions) -> Validator | None:
    """The validation Jobs adapter when ``validation.enabled``; with ``safety.dry_run`` (``actions``
    is then the dry-run recorder) it records the Jobs it would create and creates none."""
    from healer.actions.dryrun import RecordingNodeActions
    from healer.actions.validation import ValidationJobs
    from healer.actions.validation_dryrun import RecordedValidationJobs

    if not settings.validation.enabled:
        return None
    jobs = ValidationJobs(api_client, settings.validation, settings.kubernetes)
    if isinstance(actions, RecordingNodeActions):
        return RecordedValidationJobs(jobs, actions)
    return jobs


def build_process(
    settings: Settings,
    *,
    identity: str | None = None,
    clock: Callable[[], datetime] | None = None,
    upgrade: bool = False,
    transform: Callable[[RuleSet], RuleSet] = lambda rs: rs,
) -> Process:
    """Build the controller and its dashboard from ``settings``.

    ``clock`` (default: the database server's time, :class:`~healer.clock.SharedClock`) is what
    the controller records and measures every duration with, so replicas whose own clocks differ
    agree on ``for``, holds and deadlines; leader election uses this process's monotonic clock.

    Raises:
        ConfigError: no usable Kubernetes configuration.
        StoreError: the database has no schema.
        RuleError: the rule files are invalid (healer does not start on bad rules).
        ConfigError: acting (``safety.dry_run`` off) while a rule names a ticket provider that is
            not configured, without ``safety.allow_missing_providers``.
    """
    from healer.actions.addresses import KubernetesAddresses
    from healer.actions.kubernetes import make_api_client
    from healer.actions.lease import LeaderElector
    from healer.actions.node_watch import NodeWatch
    from healer.actions.pod_watch import BudgetWatch, PodWatch
    from healer.clock import SharedClock
    from healer.controller import Controller
    from healer.metrics import HealerMetrics
    from healer.rules_holder import RulesHolder
    from healer.store.clock import database_now

    identity = identity or default_identity()
    sessions = database(settings, upgrade=upgrade)
    clock = clock or SharedClock(lambda: database_now(sessions))
    rules = RulesHolder(
        settings.rules_paths,
        session_factory=sessions,
        clock=clock,
        transform=transform,
        device_filter=settings.infiniband.device_filter(),
        recording_rules=settings.detection.recording_rules,
    )
    refuse_acting_without_providers(rules.ruleset.rules, settings)
    api_client = make_api_client(settings.kubernetes)
    # The cluster's Nodes come from a watch (started with the controller): a quiet tick lists none;
    # so do the pods and PodDisruptionBudgets a drain reads.
    timeout = settings.kubernetes.request_timeout_seconds
    node_watch = NodeWatch(api_client, timeout=timeout)
    pod_watch, budget_watch = PodWatch(api_client, timeout=timeout), BudgetWatch(api_client, timeout=timeout)
    cluster, actions = node_actions(
        settings,
        api_client,
        sessions,
        identity=identity,
        clock=clock,
        node_watch=node_watch,
        pod_watch=pod_watch,
        budget_watch=budget_watch,
    )
    metrics = HealerMetrics()
    metrics.watch_nodes(node_watch)
    metrics.watch_stores({"pods": pod_watch, "poddisruptionbudgets": budget_watch})
    isolating = gpu_isolation(settings, api_client, sessions, events=actions, metrics=metrics)
    controller = Controller(
        settings=settings,
        session_factory=sessions,
        source=prometheus_source(settings),
        actions=actions,
        rules=rules,
        leadership=LeaderElector(api_client, settings.kubernetes, identity=identity, clock=clock),
        clock=clock,
        metrics=metrics,
        identity=identity,
        fleet=cluster.node_pools,
        node_labels=cluster.node_labels,
        owned=cluster.owned_nodes,
        owned_node=cluster.owned_node,
        background=(node_watch, pod_watch, budget_watch),
        addresses=KubernetesAddresses(api_client, settings.kubernetes, node_watch=node_watch).address_book,
        gpu_nodes=cluster.gpu_nodes,
        validator=validation_jobs(settings, api_client, actions),
        quota_sync=quota_sync(settings, api_client, sessions, cluster, isolating.isolation, metrics),
        gpu_isolation=isolating,
        burst=burst_sync(
            settings, api_client, sessions, cluster, pod_watch=pod_watch, budget_watch=budget_watch
        ),
        topology_file=topology_file(settings),
    )
    app = dashboard(
        settings,
        sessions,
        clock=clock,
        ruleset_provider=lambda: rules.ruleset,
        leader_provider=controller.is_leader,
        metrics=metrics,
        controller_in_process=True,
        wake=controller.wake,
    )
    return Process(controller=controller, app=app)
