"""``healer demo``: the whole loop on real services on this machine (:mod:`healer_dev.demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from healer.cli.context import dev_tooling


def demo(
    duration: Annotated[
        float | None,
        typer.Option(
            help="End once every faulted node is back in service, or after this many seconds "
            "(exit 1: the story did not finish). Default: run until Ctrl-C."
        ),
    ] = None,
    headless: Annotated[
        bool, typer.Option(help="No prompts; progress lines only (for scripts and CI).")
    ] = False,
    nodes: Annotated[int, typer.Option(min=51, help="Simulated GPU nodes (the scenario needs 51+).")] = 64,
    port: Annotated[int, typer.Option(help="Dashboard port (0: any free port).")] = 8080,
    time_scale: Annotated[
        float, typer.Option(min=0.01, max=1.0, help="Multiplier of the rules' hold times.")
    ] = 0.1,
    workdir: Annotated[
        Path, typer.Option(help="Where the demo keeps its database and Prometheus data.")
    ] = Path(".demo"),
    database_url: Annotated[
        str | None, typer.Option(help="Database URL (default: SQLite in the workdir).")
    ] = None,
    real_node_exporter: Annotated[
        bool,
        typer.Option(
            help="InfiniBand series from one real node_exporter per node on simulated sysfs trees "
            "(when installed); --no-real-node-exporter: the simulator serves them."
        ),
    ] = True,
) -> None:
    """Run healer on a simulated 64-node GPU fleet with real Prometheus: watch it quarantine, drain,
    ticket and return nodes in the dashboard. Runs from any directory (the source tree's rules/;
    --workdir is relative to where it starts). With --duration it ends, exit 0, once every node the
    scenario faults is back in service, and exits 1 if that has not happened within it."""
    from healer.logs import configure_logging

    demo_module = dev_tooling("demo", command="demo")
    configure_logging("WARNING", json=False)
    if not headless:
        print("open the dashboard URL below in a browser; Ctrl-C stops the demo")
    summary = demo_module.run_demo(
        workdir=workdir,
        nodes=nodes,
        port=port,
        duration=duration,
        time_scale=time_scale,
        database_url=database_url,
        real_node_exporter=real_node_exporter,
    )
    missing = summary.unfinished() if duration is not None else None
    if missing:
        typer.echo(
            f"error: the demo's story did not finish within --duration {duration:g}s: {missing}", err=True
        )
        raise typer.Exit(1)
