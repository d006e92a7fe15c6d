"""``healer agent``: the node agent, one per node (the chart's DaemonSet, ``agent.enabled``)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

log = logging.getLogger("healer.agent")


def agent(
    ctx: typer.Context,
    node: Annotated[
        str, typer.Option("--node", envvar="NODE_NAME", help="This node's name (downward API spec.nodeName).")
    ],
    once: Annotated[bool, typer.Option("--once", help="Handle the node's current request and exit.")] = False,
    text_logs: Annotated[
        bool, typer.Option("--text-logs", help="Plain text logs instead of JSON lines.")
    ] = False,
    metrics_port: Annotated[
        int,
        typer.Option(
            "--metrics-port", help="Serve the node's facts at /metrics on this port (0: do not serve)."
        ),
    ] = 9402,
    metrics_address: Annotated[
        str, typer.Option("--metrics-address", help="Address /metrics listens on.")
    ] = "0.0.0.0",
    metrics_only: Annotated[
        bool,
        typer.Option(
            "--metrics-only",
            help="Serve /metrics only: no repairs (needs neither the signing secret nor Kubernetes).",
        ),
    ] = False,
    print_metrics: Annotated[
        bool, typer.Option("--print-metrics", help="Print one scrape of /metrics and exit.")
    ] = False,
    facts_fixture: Annotated[
        Path | None,
        typer.Option(
            "--facts-fixture",
            help="Read the node's facts from a fixture directory (sys/, kmsg, proc/uptime, nvml.json) "
            "instead of this host (tests, demos).",
        ),
    ] = None,
) -> None:
    """Carry out the controller's signed repair requests (GPU reset, reboot, log capture) on this
    node only.

    Watches its own Node; refuses (and logs, with the reason) requests that are unsigned, wrongly
    signed, for another node, expired or replayed. Settings: ``repair.secret_env``/``secret_file``
    (the controller's signing secret), ``repair.agent_commands`` or ``repair.agent_executor``.
    SIGTERM/SIGINT stop it (exit 0).

    Serves the node's facts at ``/metrics`` (port 9402): InfiniBand hw_counters, Xid lines from the
    kernel log, NVML's GPU facts (deploy/README.md, "The node agent's metrics"). Without NVML
    (no driver, no ``nvidia-ml-py``) it logs "NVML not available: ..." and serves the rest.
    """
    from kubernetes import client as k8s

    from healer.actions.kubernetes import make_api_client
    from healer.cli.context import settings_from
    from healer.clock import utc_now
    from healer.controller.repair import repair_secret
    from healer.errors import HealerError
    from healer.logs import configure_logging
    from healer.model.repair import RepairRequest
    from healer.nodeagent.agent import NodeAgent
    from healer.nodeagent.bundle import Capture, bundle_reason
    from healer.nodeagent.executor import load_executor
    from healer.nodeagent.exposition import render, serve
    from healer.nodeagent.facts import HostFacts

    settings = settings_from(ctx)
    configure_logging(settings.log_level, json=not text_logs)
    facts = HostFacts.fixture(node, facts_fixture) if facts_fixture else HostFacts.real(node)
    if print_metrics:
        typer.echo(render(facts), nl=False)
        return
    stop = threading.Event()

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    if metrics_port or metrics_only:
        try:
            server, _thread = serve(facts, address=metrics_address, port=metrics_port)
        except OSError as exc:
            typer.echo(f"error: cannot serve /metrics on {metrics_address}:{metrics_port}: {exc}", err=True)
            raise typer.Exit(2) from exc
        log.info("node facts at http://%s:%d/metrics", metrics_address, server.server_port)
    if metrics_only:
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        stop.wait()
        return
    try:
        secret = repair_secret(settings.repair)
        if secret is None:
            raise HealerError("the agent needs repair.secret_env or repair.secret_file (the signing secret)")
        executor = load_executor(settings)
        api = make_api_client(settings.kubernetes)
    except HealerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    def bundler(request: RepairRequest) -> str:
        return Capture(
            node=node,
            why=bundle_reason(request),
            kmsg=facts.kmsg,
            nvidia_smi=settings.repair.agent_bundle_command,
            at=utc_now().isoformat(),
        ).encoded()

    node_agent = NodeAgent(
        k8s.CoreV1Api(api),
        node=node,
        domain=settings.kubernetes.domain,
        secret=secret,
        executor=executor,
        bundler=bundler,
        request_timeout_seconds=settings.kubernetes.request_timeout_seconds,
    )
    if once:
        node_agent.once()
        return
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    log.info("agent watching node %s", node)
    node_agent.watch(stop, timeout_seconds=30)
