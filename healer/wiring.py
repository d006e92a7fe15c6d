"""The composition root: builds every adapter from the settings, and the clock.

Nothing else in healer reads the clock or chooses an implementation: dry-run is decided here
(``RecordingNodeActions`` instead of ``KubernetesNodeActions``), not by ``if`` statements in callers.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import FastAPI
from sqlalchemy import inspect
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from healer.actions.dryrun import RecordingNodeActions
from healer.actions.kubernetes import KubernetesNodeActions, make_api_client
from healer.actions.lease import LeaderElector
from healer.config import Settings
from healer.controller import Controller
from healer.errors import StoreError
from healer.metrics import HealerMetrics
from healer.rules_holder import RulesHolder
from healer.ruleset.schema import RuleSet
from healer.sources.prometheus import PrometheusSource
from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from healer.tickets.coverage import refuse_acting_without_providers


def utc_now() -> datetime:
    """The one clock: aware UTC."""
    return datetime.now(UTC)


def default_identity() -> str:
    """This replica's name for the Lease: the pod name in a cluster (``HOSTNAME``), else host+pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def database(settings: Settings, *, upgrade: bool = False) -> sessionmaker[Session]:
    """Sessions on the configured database; with ``upgrade`` the schema is migrated first.

    Raises:
        StoreError: the schema is missing (run ``healer db upgrade``).
    """
    if upgrade:
        migrate.upgrade(settings.database.url)
    engine = make_engine(settings.database.url, echo=settings.database.echo)
    if "alembic_version" not in inspect(engine).get_table_names():
        raise StoreError(f"the database has no healer schema; run `healer db upgrade` first ({engine.url!r})")
    return make_sessionmaker(engine)


@dataclass
class Process:
    """A built controller process: the controller and the dashboard app it serves."""

    controller: Controller
    app: FastAPI


def build_process(
    settings: Settings,
    *,
    identity: str | None = None,
    clock: Callable[[], datetime] = utc_now,
    upgrade: bool = False,
    transform: Callable[[RuleSet], RuleSet] = lambda rs: rs,
) -> Process:
    """Build the controller and its dashboard from ``settings``.

    Raises:
        ConfigError: no usable Kubernetes configuration.
        StoreError: the database has no schema.
        RuleError: the rule files are invalid (healer does not start on bad rules).
        ConfigError: acting (``safety.dry_run`` off) while a rule names a ticket provider that is
            not configured, without ``safety.allow_missing_providers``.
    """
    identity = identity or default_identity()
    sessions = database(settings, upgrade=upgrade)
    rules = RulesHolder(settings.rules_paths, session_factory=sessions, clock=clock, transform=transform)
    refuse_acting_without_providers(rules.ruleset.rules, settings)
    api_client = make_api_client(settings.kubernetes)
    cluster = KubernetesNodeActions(api_client, settings.kubernetes, identity=identity, clock=clock)
    actions = RecordingNodeActions(cluster, sessions, clock=clock) if settings.safety.dry_run else cluster
    metrics = HealerMetrics()
    controller = Controller(
        settings=settings,
        session_factory=sessions,
        source=PrometheusSource.from_settings(settings.prometheus),
        actions=actions,
        rules=rules,
        leadership=LeaderElector(api_client, settings.kubernetes, identity=identity, clock=clock),
        clock=clock,
        metrics=metrics,
        identity=identity,
        fleet=cluster.node_pools,
    )
    app = create_app(
        settings,
        sessions,
        clock=clock,
        ruleset_provider=lambda: rules.ruleset,
        leader_provider=lambda: controller.is_leader,
        metrics=metrics,
    )
    return Process(controller=controller, app=app)
