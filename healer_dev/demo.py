"""``healer demo``: the whole loop on real services on this machine.

Starts, in this order: the fleet simulator (N nodes x 8 GPUs, the demo fault scenario), a real
Prometheus scraping it (the ``prometheus`` binary), an emulated Kubernetes API holding the same
nodes with realistic pods (training Jobs, inference ReplicaSets behind a PodDisruptionBudget,
DaemonSets, mirror pods), a stand-in provider webhook that acknowledges and later resolves tickets
(signed), and healer itself (``healer run`` in-process, SQLite) with its dashboard.

The default rule pack runs unchanged except for its hold times: ``for``, ``keep_firing_for`` and
group intervals are multiplied by ``time_scale`` (default 0.1: a 5 m ``for`` holds 30 s), so the
story fits in a few minutes. The demo says so when it starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from healer.config import Settings, load_settings
from healer.model.states import NodeState
from healer.redaction import redact_url
from healer.ruleset.schema import RuleSet
from healer.store.models import Node, Ticket, Transition
from healer.wiring import build_process
from healer_dev.k8s_emulator import KubernetesEmulator, gpu_fleet, namespace
from healer_dev.node_exporter import binary as node_exporter_binary
from healer_dev.prometheus import free_port, prometheus_server, wait_until
from healer_dev.provider import Receiver
from healer_dev.simulator.fleet import Fleet, FleetConfig
from healer_dev.simulator.scenario import load_scenario
from healer_dev.simulator.server import ElapsedClock, SimulatorServer
from healer_dev.simulator.sysfs import real_node_exporters

DEMO_SCENARIO = Path(__file__).parent / "simulator" / "scenarios" / "demo.yaml"
#: The default rule pack of this source tree (``rules/`` beside ``healer_dev/``), so the demo runs
#: from any working directory.
DEMO_RULES = Path(__file__).resolve().parents[1] / "rules"


#: A team's own Prometheus alerting-rule file the demo loads beside the pack (rule input in
#: Prometheus's format: its ``healer_actions`` annotation quarantines the scenario's PCIe node).
DEMO_ALERTS = Path(__file__).parent / "demo_alerts"


def demo_rules_paths() -> list[Path]:
    """The rule files the demo runs: the source tree's pack (else the ``rules_paths`` default) and
    the team's alert file of :data:`DEMO_ALERTS`."""
    return [DEMO_RULES if DEMO_RULES.is_dir() else Path("rules"), DEMO_ALERTS]


_RANGE = re.compile(r"\[(\d+)([mh])\]")


def _scale_ranges(expr: str, factor: float) -> str:
    """``increase(x[10m])`` → ``increase(x[60s])`` at factor 0.1 (at least 30 s: a few scrapes)."""

    def scaled(match: re.Match[str]) -> str:
        seconds = int(match.group(1)) * (60 if match.group(2) == "m" else 3600)
        return f"[{max(30, int(seconds * factor))}s]"

    return _RANGE.sub(scaled, expr)


def scale_holds(ruleset: RuleSet, factor: float, *, max_interval: float = 5.0) -> RuleSet:
    """The same rules with ``for``, ``keep_firing_for`` and range windows times ``factor``, and
    group intervals capped at ``max_interval`` seconds, so a demo's story fits in minutes."""
    groups = tuple(
        g.model_copy(
            update={
                "interval": min(g.interval or max_interval, max_interval),
                "rules": [
                    r.model_copy(
                        update={
                            "for_": r.for_ * factor,
                            "keep_firing_for": r.keep_firing_for * factor,
                            "expr": _scale_ranges(r.expr, factor),
                        }
                    )
                    for r in g.rules
                ],
            }
        )
        for g in ruleset.groups
    )
    return ruleset.model_copy(update={"groups": groups})


@dataclass
class DemoSummary:
    """What the demo saw at the end: nodes per state and tickets per status."""

    states: dict[str, int]
    tickets: dict[str, int]
    dashboard: str
    returned: int = 0  # nodes healer put back into service after repair and validation
    #: Nodes healer quarantined during the demo and that are not healthy again yet.
    still_out: list[str] = field(default_factory=list)
    #: Nodes returned to service (validating -> healthy) during the demo.
    returned_nodes: frozenset[str] = frozenset()
    #: Nodes the scenario faults (:meth:`Scenario.faulted_nodes`): the story ends when all are back.
    faulted: frozenset[str] = frozenset()

    def unfinished(self) -> str | None:
        """What the story's end state (every faulted node taken out and back in service) still
        lacks; None when it was reached."""
        if self.still_out:
            shown = ", ".join(self.still_out[:5]) + (" ..." if len(self.still_out) > 5 else "")
            return f"{len(self.still_out)} faulted node(s) not returned to service: {shown}"
        if not self.returned:
            return "no node was quarantined and returned to service"
        if waiting := sorted(self.faulted - self.returned_nodes):
            return f"{len(waiting)} faulted node(s) not taken out and returned yet: {', '.join(waiting)}"
        return None

    def line(self) -> str:
        states = ", ".join(f"{k}={v}" for k, v in sorted(self.states.items()) if k != NodeState.HEALTHY)
        tickets = ", ".join(f"{k}={v}" for k, v in sorted(self.tickets.items()))
        return (
            f"nodes: {states or 'all healthy'} | tickets: {tickets or 'none'} | "
            f"returned to service: {self.returned}"
        )


@dataclass
class DemoEnvironment:
    """Handles on a running demo (tests assert through them)."""

    settings: Settings
    sessions: sessionmaker[Session]
    dashboard: str
    fleet: Fleet
    emulator: KubernetesEmulator
    receiver: Receiver
    prometheus_url: str


def new_steps(session: Session, after: int) -> tuple[list[str], int]:
    """Lifecycle steps recorded after transition id ``after``, oldest first, one line each
    (``gpu-node-07: healthy -> quarantined (reason)``), and the last id seen."""
    rows = session.execute(
        select(Transition.id, Node.name, Transition.from_state, Transition.to_state, Transition.reason)
        .join(Node, Node.id == Transition.node_id)
        .where(Transition.id > after)
        .order_by(Transition.id)
    ).all()
    lines = [f"{name}: {old} -> {new} ({reason})" for _, name, old, new, reason in rows]
    return lines, (rows[-1][0] if rows else after)


def summarize(
    settings: Settings,
    sessions: sessionmaker[Session],
    dashboard: str,
    *,
    faulted: frozenset[str] = frozenset(),
) -> DemoSummary:
    """Nodes per state, tickets per status, and how far the story is (``faulted``: the nodes it
    must take out and return)."""
    with sessions() as session:
        states = {k: v for k, v in session.execute(select(Node.state, func.count()).group_by(Node.state))}
        tickets = {
            k: v for k, v in session.execute(select(Ticket.status, func.count()).group_by(Ticket.status))
        }
        returned_nodes = frozenset(
            session.scalars(
                select(Node.name)
                .join(Transition, Transition.node_id == Node.id)
                .where(Transition.from_state == NodeState.VALIDATING)
                .where(Transition.to_state == NodeState.HEALTHY)
                .distinct()
            )
        )
        quarantined = select(Transition.node_id).where(Transition.to_state == NodeState.QUARANTINED)
        still_out = list(
            session.scalars(
                select(Node.name)
                .where(Node.id.in_(quarantined), Node.state != NodeState.HEALTHY)
                .order_by(Node.name)
            )
        )
    return DemoSummary(
        states=states,
        tickets=tickets,
        dashboard=dashboard,
        returned=len(returned_nodes),
        still_out=still_out,
        returned_nodes=returned_nodes,
        faulted=faulted,
    )


@contextlib.contextmanager
def demo_environment(
    *,
    workdir: Path,
    nodes: int = 64,
    port: int = 8080,
    time_scale: float = 0.1,
    scenario: Path = DEMO_SCENARIO,
    database_url: str | None = None,
    resolve_after: float = 90.0,
    speed: float = 1.0,
    real_node_exporter: bool = True,
) -> Iterator[DemoEnvironment]:
    """Bring everything up, yield handles on all of it, tear it all down.

    ``real_node_exporter``: the InfiniBand series come from one real node_exporter per node reading
    the simulator's sysfs tree, when node_exporter is installed (one line says which is used);
    False: the simulator serves them itself.
    """
    if shutil.which("prometheus") is None:
        raise SystemExit(
            "error: the demo needs Prometheus: install it with `sudo apt-get install prometheus` "
            "(Debian/Ubuntu), or put a prometheus binary on PATH"
        )
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)

    fleet = Fleet(FleetConfig(nodes=nodes), load_scenario(scenario))
    clock = ElapsedClock(speed=speed)
    simulator = SimulatorServer(fleet, clock=clock).start()
    stack = contextlib.ExitStack()
    node_exporters = None
    if real_node_exporter and node_exporter_binary() is not None:
        print(
            f"InfiniBand: {nodes} real node_exporters read the simulated sysfs trees "
            f"({workdir / 'sysfs'}/<node>, --path.sysfs)",
            flush=True,
        )
        try:
            node_exporters = stack.enter_context(
                real_node_exporters(fleet, clock, workdir / "sysfs", interval=2.0, traffic_every=5)
            )
        except BaseException:
            simulator.stop()
            raise
    elif real_node_exporter:
        print(
            "InfiniBand: node_exporter not installed (Debian package prometheus-node-exporter): "
            "the simulator serves the InfiniBand series itself",
            flush=True,
        )
    # The scenario starts now: writing 64 sysfs trees and starting 64 exporters takes a while on a
    # busy machine, and the first faults (Xid 79 at 1 min) must not be over before Prometheus looks.
    clock.restart()
    sd_file = simulator.write_file_sd(workdir / "fleet-targets.json", node_exporters=node_exporters)

    emulator = KubernetesEmulator(auto_reschedule=True).start()
    emulator.load([namespace("healer-system"), *gpu_fleet(nodes)])
    kubeconfig = emulator.write_kubeconfig(workdir / "kubeconfig")

    provider_secret = secrets.token_hex(16)
    callback_secret = secrets.token_hex(16)
    os.environ["HEALER_DEMO_PROVIDER_SECRET"] = provider_secret
    os.environ["HEALER_DEMO_CALLBACK_SECRET"] = callback_secret
    dashboard = f"http://127.0.0.1:{port}"
    receiver = Receiver(
        secret=provider_secret.encode(),
        callback_url=dashboard,
        callback_secret=callback_secret.encode(),
        ack_after=10.0,
        resolve_after=resolve_after,
    ).start()

    try:
        with prometheus_server(
            [],
            file_sd=[sd_file],
            scrape_interval="2s",
            evaluation_interval="2s",
            workdir=workdir / "prometheus",
        ) as prometheus:
            settings = load_settings(
                rules_paths=demo_rules_paths(),
                database={"url": database_url or f"sqlite:///{(workdir / 'healer.db').absolute()}"},
                prometheus={"url": prometheus.url, "timeout_seconds": 5, "tick_deadline_seconds": 4},
                kubernetes={
                    "kubeconfig": kubeconfig,
                    "lease_duration_seconds": 15,
                    "renew_interval_seconds": 3,
                },
                scheduler={"outbox_interval_seconds": 2, "drain_interval_seconds": 3},
                safety={
                    "dry_run": False,
                    "max_unhealthy": 8,
                    "max_unhealthy_percent": 15,
                    "breaker_nodes": 10,
                    "recovery_hold_seconds": 300 * time_scale,
                },
                tickets={
                    "cluster_name": "demo",
                    "dashboard_url": dashboard,
                    "providers": [
                        {
                            "name": "default",
                            "url": f"{receiver.url}/tickets",
                            "secret_env": "HEALER_DEMO_PROVIDER_SECRET",
                        }
                    ],
                    "callback_secret_env": "HEALER_DEMO_CALLBACK_SECRET",
                },
                api={"port": port, "anonymous_role": "operator"},
            )
            process = build_process(
                settings,
                identity="healer-demo",
                upgrade=True,
                transform=lambda rs: scale_holds(rs, time_scale),
            )
            server = uvicorn.Server(
                uvicorn.Config(process.app, host="127.0.0.1", port=port, log_config=None, access_log=False)
            )
            thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
            thread.start()
            wait_until(lambda: server.started, timeout=20, what="dashboard")
            wait_until(
                lambda: (
                    prometheus.query("count(up == 1)")
                    and prometheus.query("count(up == 1)")[0]["value"][1] == str(2 * nodes)
                ),
                timeout=60,
                what="Prometheus scraping every simulated exporter",
            )
            process.controller.start()
            technician = _Technician(fleet, simulator.clock, process.controller.session_factory)
            technician.start()
            try:
                yield DemoEnvironment(
                    settings=settings,
                    sessions=process.controller.session_factory,
                    dashboard=dashboard,
                    fleet=fleet,
                    emulator=emulator,
                    receiver=receiver,
                    prometheus_url=prometheus.url,
                )
            finally:
                technician.stop()
                # The dashboard first: a request after the controller disposed the database's
                # engine would open a connection nobody closes.
                server.should_exit = True
                thread.join(timeout=10)
                process.controller.stop()
    finally:
        receiver.stop()
        emulator.stop()
        stack.close()
        simulator.stop()


class _Technician(threading.Thread):
    """The provider's technician: once a ticket is acknowledged, the part is replaced (the node's
    simulated faults end), before the provider reports the ticket resolved."""

    def __init__(self, fleet: Fleet, clock: Callable[[], float], sessions: sessionmaker[Session]) -> None:
        super().__init__(name="demo-technician", daemon=True)
        self.fleet, self.clock, self.sessions = fleet, clock, sessions
        self.repaired: set[int] = set()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(2.0):
            with self.sessions() as session:
                rows = session.execute(
                    select(Ticket.id, Node.name)
                    .join(Node, Node.id == Ticket.node_id)
                    .where(Ticket.status.in_(["acknowledged", "in_progress", "resolved"]))
                ).all()
            for ticket_id, node in rows:
                if ticket_id not in self.repaired:
                    self.repaired.add(ticket_id)
                    if self.fleet.repair(node, self.clock()):
                        print(
                            f"  provider: replaced the faulty part of {node} (ticket {ticket_id})", flush=True
                        )

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def stop_on_sigterm() -> None:
    """Make SIGTERM stop the demo as Ctrl-C does (``KeyboardInterrupt``), so its Prometheus,
    exporters and API servers are stopped on the way out; only the main thread can set it."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def banner(
    *, nodes: int, time_scale: float, dashboard: str, prometheus: str, database: str | None = None
) -> list[str]:
    """The demo's opening lines: what runs, the time scale, and where to look (the dashboard, the
    demo's Prometheus for ``healer evaluate --once`` or ``healer doctor exporters``, and its
    database for ``healer node list``, ``ticket stats`` ..., credentials redacted)."""
    lines = [
        f"healer demo: {nodes} nodes x 8 GPUs, Prometheus, emulated Kubernetes API, provider webhook",
        f"rule hold times and range windows scaled by {time_scale} "
        f"(a 5m `for` holds {300 * time_scale:.0f}s)",
        f"dashboard: {dashboard}/   (JSON API: {dashboard}/api/v1/nodes)",
    ]
    if database is not None:
        url = redact_url(database) if "@" in database else database  # a file path has no secret
        lines.append(f"database: {url}   (e.g. HEALER_DATABASE__URL={url} healer node list)")
    lines.append(
        f"prometheus: {prometheus}   (e.g. HEALER_PROMETHEUS__URL={prometheus} healer doctor exporters)"
    )
    return lines


def run_demo(
    *,
    workdir: Path,
    nodes: int = 64,
    port: int = 0,
    duration: float | None = None,
    time_scale: float = 0.1,
    database_url: str | None = None,
    report_every: float = 15.0,
    real_node_exporter: bool = True,
) -> DemoSummary:
    """Run the demo, printing progress, until Ctrl-C; with ``duration``, until the story is over
    (every node the scenario faults is back in service) or ``duration`` seconds have passed."""
    faulted = load_scenario(DEMO_SCENARIO).faulted_nodes()
    port = port or free_port()
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise SystemExit(
                f"error: port {port} is in use; pass --port N (or --port 0 for any free port)"
            ) from None
    with demo_environment(
        workdir=workdir,
        nodes=nodes,
        port=port,
        time_scale=time_scale,
        database_url=database_url,
        real_node_exporter=real_node_exporter,
    ) as env:
        settings, sessions, dashboard = env.settings, env.sessions, env.dashboard
        for line in banner(
            nodes=nodes,
            time_scale=time_scale,
            dashboard=dashboard,
            prometheus=env.prometheus_url,
            database=settings.database.url,
        ):
            print(line, flush=True)
        started = time.monotonic()
        next_report = started + report_every
        last_step = 0
        stop_on_sigterm()  # `kill`, a CI timeout: the same clean stop as Ctrl-C (no exporter left behind)
        try:
            while duration is None or time.monotonic() - started < duration:
                time.sleep(0.5)
                # every lifecycle step as it happens: quarantine, drain, ticket wait, repair, return
                with sessions() as session:
                    steps, last_step = new_steps(session, last_step)
                for step in steps:
                    print(f"[{time.monotonic() - started:5.0f}s] {step}", flush=True)
                if (
                    duration is not None
                    and steps
                    and summarize(settings, sessions, dashboard, faulted=faulted).unfinished() is None
                ):
                    elapsed = time.monotonic() - started
                    print(f"[{elapsed:5.0f}s] the story is over: every faulted node is back in service")
                    break
                if time.monotonic() >= next_report:
                    line = summarize(settings, sessions, dashboard).line()
                    print(f"[{time.monotonic() - started:5.0f}s] {line}", flush=True)
                    next_report += report_every
        except KeyboardInterrupt:
            print("stopping ...")
        summary = summarize(settings, sessions, dashboard, faulted=faulted)
        print(f"final: {summary.line()}", flush=True)
        return summary
