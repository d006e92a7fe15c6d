"""``healer simulate``: serve a simulated GPU fleet for Prometheus to scrape (healer_dev.simulator)."""

from __future__ import annotations

import signal
import sys
import time
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from healer.cli.context import dev_tooling


class LabelStyle(StrEnum):
    """The simulator's label styles (``healer_dev.simulator.fleet.LabelStyle``), spelled here so
    that ``healer --help`` does not load the simulator."""

    HOSTNAME = "Hostname"
    HOSTNAME_LOWER = "hostname"
    NODE = "node"
    EXPORTED = "exported"


class ExporterVersion(StrEnum):
    """dcgm-exporter output shapes (``healer_dev.simulator.fleet.EXPORTER_VERSIONS``)."""

    REFERENCE = "reference"
    V3 = "3.x"
    V4 = "4.x"


def simulate(
    nodes: Annotated[int, typer.Option(min=1, max=100_000, help="Nodes (8 GPUs, 8 HCAs each).")] = 64,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port of the HTTP server (0 = any).")] = 9400,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    scenario: Annotated[
        str | None,
        typer.Option(help="Scenario YAML file or a packaged scenario's name ('demo'); none = healthy."),
    ] = None,
    label_style: Annotated[
        LabelStyle,
        typer.Option(
            "--label-style",
            case_sensitive=True,
            help="Hostname | hostname (newest exporter) | node (relabeled target label) | exported "
            "(ServiceMonitor exported_pod/...).",
        ),
    ] = LabelStyle.HOSTNAME,
    seed: Annotated[int, typer.Option(help="Seed of identities, baselines and noise.")] = 0,
    file_sd: Annotated[
        Path | None, typer.Option("--file-sd", dir_okay=False, help="Write Prometheus file_sd JSON here.")
    ] = None,
    advertise: Annotated[
        str | None, typer.Option(help="host:port put in the targets (default: the listening address).")
    ] = None,
    speed: Annotated[float, typer.Option(min=0.001, help="Scenario time runs this many times faster.")] = 1.0,
    idle_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of idle nodes.")] = 0.05,
    exporter_version: Annotated[
        ExporterVersion,
        typer.Option(
            "--exporter-version",
            help="dcgm-exporter output shape: 3.x (CLOCK_THROTTLE_REASONS, a zero Xid series per GPU), "
            "4.x (CLOCKS_EVENT_REASONS, labels sorted, no Xid series until the first Xid), or reference "
            "(tests/fixtures/dcgm-exporter.prom).",
        ),
    ] = ExporterVersion.REFERENCE,
    management_hcas: Annotated[
        int, typer.Option(min=0, max=4, help="Management HCAs per node after the 8 compute ones (mlx5_8...).")
    ] = 0,
    nvlink5: Annotated[
        bool,
        typer.Option(
            "--nvlink5",
            help="The GPUs have NVLink5 (Blackwell): the exporter also reports the NVLink5 link "
            "counters of counters-4.x.csv (with --exporter-version 4.x or reference).",
        ),
    ] = False,
    shard: Annotated[
        str | None,
        typer.Option(
            help="K/N: list only the nodes whose index is K modulo N in --file-sd (N processes, each "
            "with the same fleet options and --started-at, serve one fleet on N cores).",
        ),
    ] = None,
    started_at: Annotated[
        float | None,
        typer.Option(help="Unix time at which scenario time 0 is (default: when this process starts)."),
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Serve at most N connections at once (default: no limit); the rest wait in the listen "
            "queue. Only for scrapers without keep-alive: a kept-alive connection holds its place.",
        ),
    ] = None,
) -> None:
    """Serve dcgm-exporter and node_exporter scrapes for a simulated fleet, with scripted faults."""
    part = _shard(shard)
    sim = dev_tooling("simulator", command="simulate")
    try:
        loaded = sim.load_scenario(scenario) if scenario else sim.Scenario()
        fleet = sim.Fleet(
            sim.FleetConfig(
                nodes=nodes,
                seed=seed,
                label_style=sim.LabelStyle(label_style),
                idle_fraction=idle_fraction,
                exporter_version=str(exporter_version),
                management_hcas=management_hcas,
                nvlink5=nvlink5,
            ),
            loaded,
        )
    except sim.ScenarioError as exc:
        typer.echo(f"error: invalid scenario\n{exc}", err=True)
        raise typer.Exit(2) from exc
    except ValueError as exc:  # a fleet shape that cannot be (--nvlink5 with a 3.x exporter)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    try:
        offset = (time.time() - started_at) * speed if started_at is not None else 0.0
        clock = sim.ElapsedClock(speed=speed, offset=offset)
        server = sim.SimulatorServer(
            fleet, clock=clock, host=host, port=port, advertise=advertise, max_connections=max_connections
        )
    except OSError as exc:
        typer.echo(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        raise typer.Exit(1) from exc
    if file_sd is not None:
        names = fleet.node_names
        server.write_file_sd(file_sd, nodes=names[part[0] :: part[1]] if part else None)
    first = fleet.node_names[0]
    typer.echo(
        f"simulating {nodes} nodes ({label_style} labels, dcgm-exporter {exporter_version} shape, "
        f"seed {seed}, "
        f"{len(loaded.faults)} faults{f' from {scenario}' if scenario else ''})\n"
        f"  {server.url}/nodes/{first}/dcgm/metrics\n"
        f"  {server.url}/nodes/{first}/node/metrics\n"
        f"  {server.url}/targets (http_sd)  {server.url}/status"
        + (f"\n  file_sd written to {file_sd}" if file_sd else "")
    )

    def _stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        sys.stdout.flush()


def _shard(text: str | None) -> tuple[int, int] | None:
    """``K/N`` as (K, N); exit 2 on anything else."""
    if text is None:
        return None
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit()) or not 0 <= int(k) < int(n):
        typer.echo(f"error: --shard {text!r}: expected K/N with 0 <= K < N", err=True)
        raise typer.Exit(2)
    return int(k), int(n)
