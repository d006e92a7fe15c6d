"""The benchmarks' simulated fleet (one or several ``healer simulate`` processes writing file_sd)
and the engine that scrapes it and evaluates rules (Prometheus, or VictoriaMetrics with vmalert).

One Python process renders every scrape of the fleet; at 10,240 nodes (20,480 targets, about 1 ms
of CPU per scrape with its HTTP answer) that is about 20 s of one core per scrape round, more than
a 15 s scrape interval allows on one core. ``processes`` > 1 starts that many simulators with the
same fleet options, each listing every N-th node in its own file_sd file (``--shard K/N``) and
sharing one scenario clock (``--started-at``), so the scrapes spread over the machine's cores and
the fleet is the same as one process would serve (same seed, same identities, same faults).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from healer.ruleset.schema import RuleSet
from healer.ruleset.scrape_keep import kept_metrics, metric_relabel_configs
from healer_dev.prometheus import free_port, wait_until
from healer_dev.victoria_metrics import victoria_metrics_server
from healer_dev.vmalert import vmalert_server

__all__ = [
    "VM_ARGS",
    "VM_SIMULATOR_CONNECTIONS",
    "Engine",
    "SimulatedFleet",
    "pack_keep_list",
    "process_rss_mib",
    "scraped_samples",
    "start_engine",
    "start_fleet",
    "wait_for_targets",
    "warm_fleet",
]

#: VictoriaMetrics flags for a fleet of thousands of nodes on a shared machine: caches capped at a
#: quarter of the RAM (default 60 %), room for the pack's widest selections (a counter of every
#: HCA port: 82k series at 10,240 nodes, several in one rule) and for queries that queue.
VM_ARGS = (
    "-memory.allowedPercent=25",
    "-search.maxUniqueTimeseries=5000000",
    "-search.maxQueryDuration=300s",
    "-search.maxQueueDuration=300s",
    "-promscrape.suppressScrapeErrors",
)


#: Connections each simulator serves at once behind VictoriaMetrics (one scrape per connection):
#: a few per core; the rest wait in the listen queue instead of as threads.
VM_SIMULATOR_CONNECTIONS = 8


@dataclass
class SimulatedFleet:
    """The simulator processes and their file_sd files (one per process)."""

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    file_sd: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        """Terminate every simulator (killed after 30 s)."""
        for proc in self.processes:
            _stop(proc)


def start_fleet(
    healer: str,
    *,
    nodes: int,
    workdir: Path,
    processes: int = 1,
    speed: float = 10.0,
    scenario: str = "demo",
    ready_timeout: float = 300.0,
    max_connections: int | None = None,
) -> SimulatedFleet:
    """Start ``processes`` simulators serving ``nodes`` nodes (the ``scenario`` at ``speed``);
    return once every one has written its file_sd. Logs go to ``workdir/simulator-<k>.log``.

    Raises SystemExit with the end of its log when a simulator exits early; TimeoutError when the
    files are not written within ``ready_timeout`` seconds. ``max_connections``: each simulator
    serves at most that many connections at once (``healer simulate --max-connections``; for an
    engine scraping without keep-alive, :data:`VM_SIMULATOR_CONNECTIONS`).
    """
    fleet = SimulatedFleet()
    started_at = time.time()
    for k in range(processes):
        sd = workdir / ("targets.json" if processes == 1 else f"targets-{k}.json")
        command = [
            healer,
            "simulate",
            f"--nodes={nodes}",
            f"--port={free_port()}",
            f"--scenario={scenario}",
            f"--speed={speed:g}",
            f"--file-sd={sd}",
        ]
        if processes > 1:
            command += [f"--shard={k}/{processes}", f"--started-at={started_at}"]
        if max_connections is not None:
            command.append(f"--max-connections={max_connections}")
        log = workdir / f"simulator-{k}.log"
        fleet.processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("wb")))
        fleet.file_sd.append(sd)

    def ready() -> bool:
        for k, proc in enumerate(fleet.processes):
            if proc.poll() is not None:
                tail = (workdir / f"simulator-{k}.log").read_text()[-2000:]
                raise SystemExit(f"healer simulate exited: {tail}")
        return all(p.is_file() for p in fleet.file_sd)

    try:
        wait_until(ready, timeout=ready_timeout, what="simulator file_sd")
    except BaseException:
        fleet.stop()
        raise
    return fleet


@dataclass
class Engine:
    """A running engine: ``query_url`` answers PromQL, ``rules_url`` serves ``/api/v1/rules`` and
    the evaluator's ``/metrics`` (Prometheus: the same server; VictoriaMetrics: vmalert), ``pid`` is
    the storing process (for its RSS); ``evaluates_full_fleet_first``: the first rule evaluation
    already had every target up (else wait for the second)."""

    name: str
    query_url: str
    rules_url: str
    pid: int
    evaluates_full_fleet_first: bool = False


def start_engine(
    engine: str,
    stack: contextlib.ExitStack,
    *,
    workdir: Path,
    file_sd: Sequence[Path],
    rule_file: Path,
    scrape_interval: int,
    rule_interval: int,
    prometheus_args: Sequence[str] = (),
    targets: int = 0,
    metric_relabel_configs: Sequence[Mapping[str, Any]] = (),
    prometheus_binary: str | None = None,
) -> Engine:
    """Start ``engine`` (``prometheus`` or ``victoria-metrics``) scraping ``file_sd`` every
    ``scrape_interval`` seconds and evaluating ``rule_file`` (groups without an interval every
    ``rule_interval`` seconds); stopped when ``stack`` closes.

    VictoriaMetrics runs with ``-search.latencyOffset=0s`` (:mod:`healer_dev.victoria_metrics`) and
    :data:`VM_ARGS`; vmalert evaluates the rules against it (:mod:`healer_dev.vmalert`), started
    once ``targets`` targets are up, so its first evaluation (at its start) sees the whole fleet
    (``Engine.evaluates_full_fleet_first``). ``metric_relabel_configs`` goes into the scrape job
    (both engines read Prometheus's format), e.g. :func:`pack_keep_list`. ``prometheus_binary``:
    the ``prometheus`` to run (default Debian's on PATH), with ``prometheus_args`` added.
    """
    if engine == "victoria-metrics":
        vm = stack.enter_context(
            victoria_metrics_server(
                file_sd=file_sd,
                scrape_interval=f"{scrape_interval}s",
                workdir=workdir / "vm",
                extra_args=VM_ARGS,
                ready_timeout=120,
                keepalive=False,
                metric_relabel_configs=metric_relabel_configs,
            )
        )
        wait_for_targets(vm.url, targets, timeout=10 * scrape_interval + 900)
        alert = stack.enter_context(
            vmalert_server(
                [rule_file],
                datasource_url=vm.url,
                evaluation_interval=f"{rule_interval}s",
                workdir=workdir / "vmalert",
            )
        )
        return Engine(
            name="vmalert",
            query_url=vm.url,
            rules_url=alert.url,
            pid=vm.process.pid,
            evaluates_full_fleet_first=True,
        )
    prometheus = prometheus_binary or shutil.which("prometheus")
    if not prometheus:
        raise SystemExit("needs `prometheus` (Debian package) on PATH")
    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{scrape_interval}s", "evaluation_interval": f"{rule_interval}s"},
        "rule_files": [str(rule_file)],
        "scrape_configs": [
            {"job_name": "simulator", "file_sd_configs": [{"files": [str(p) for p in file_sd]}]}
        ],
    }
    if metric_relabel_configs:
        config["scrape_configs"][0]["metric_relabel_configs"] = [dict(r) for r in metric_relabel_configs]
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *prometheus_args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "prometheus.log").open("wb"),
    )
    stack.callback(_stop, proc)
    wait_until(lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200, timeout=120)
    return Engine(name="Prometheus", query_url=url, rules_url=url, pid=proc.pid)


def pack_keep_list(ruleset: RuleSet) -> list[dict[str, Any]]:
    """The ``metric_relabel_configs`` keeping only the metrics ``ruleset`` reads (what
    ``healer rules scrape-keep`` prints): the benches' ``--keep-pack-metrics``."""
    return metric_relabel_configs(kept_metrics(ruleset))


def process_rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident set size of ``pid``, MiB (from /proc): now, or its peak with ``field="VmHWM"``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def scraped_samples(query_url: str) -> tuple[float, float]:
    """Samples per scrape round over every target, as scraped and as stored after
    ``metric_relabel_configs`` (``sum(scrape_samples_scraped)``,
    ``sum(scrape_samples_post_metric_relabeling)``, both engines' per-scrape series): about the
    series the exporters offer and the series the engine keeps."""

    def total(expr: str) -> float:
        r = httpx.get(f"{query_url}/api/v1/query", params={"query": f"sum({expr})"}, timeout=120).json()
        result = r["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0

    return total("scrape_samples_scraped"), total("scrape_samples_post_metric_relabeling")


def warm_fleet(fleet: SimulatedFleet, *, timeout: float = 60.0) -> float:
    """Scrape every target of ``fleet`` once, one request at a time per simulator (one keep-alive
    connection each, so one serving thread); return the seconds taken.

    A simulator builds a node's exposition templates at its first scrape (milliseconds per node).
    An engine that discovers 20,480 cold targets at once (10,240 nodes) opens hundreds of
    connections while the first scrapes are slow, and the simulator answers each in a thread of its
    own: in session 5 the load average rose from 9 to 51 within 15 s. Warmed, a scrape is about 1 ms.
    Raises httpx.HTTPError when a target does not answer 200.
    """
    import json
    from concurrent.futures import ThreadPoolExecutor

    def warm(sd: Path) -> None:
        groups = json.loads(sd.read_text())
        with httpx.Client(timeout=timeout) as client:
            for group in groups:
                for target in group["targets"]:
                    client.get(f"http://{target}{group['labels']['__metrics_path__']}").raise_for_status()

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(fleet.file_sd)) as pool:
        list(pool.map(warm, fleet.file_sd))
    return time.monotonic() - started


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_targets(query_url: str, targets: int, *, timeout: float) -> float:
    """Wait until the engine at ``query_url`` has ``targets`` targets up; return the seconds waited."""

    def up() -> bool:
        r = httpx.get(f"{query_url}/api/v1/query", params={"query": "count(up == 1)"}, timeout=60).json()
        result = r["data"]["result"]
        return bool(result) and int(float(result[0]["value"][1])) >= targets

    started = time.monotonic()
    wait_until(up, timeout=timeout, interval=5, what=f"{targets} targets up")
    return time.monotonic() - started


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The benches' fleet options: ``--simulators N`` and ``--keep-pack-metrics``."""
    parser.add_argument("--simulators", type=int, default=1, help="simulator processes serving the fleet")
    parser.add_argument(
        "--keep-pack-metrics",
        action="store_true",
        help="the engine stores only the metrics the pack reads (the metric_relabel_configs of "
        "`healer rules scrape-keep` in its scrape job); every other scraped series is dropped",
    )


def start_warm_fleet(
    healer: str, *, nodes: int, workdir: Path, processes: int, engine: str, stack: contextlib.ExitStack
) -> SimulatedFleet:
    """:func:`start_fleet` (stopped with ``stack``), every target scraped once (:func:`warm_fleet`);
    behind VictoriaMetrics, which scrapes without keep-alive, each simulator serves at most
    :data:`VM_SIMULATOR_CONNECTIONS` connections at once."""
    fleet = start_fleet(
        healer,
        nodes=nodes,
        workdir=workdir,
        processes=processes,
        max_connections=VM_SIMULATOR_CONNECTIONS if engine == "victoria-metrics" else None,
    )
    stack.callback(fleet.stop)
    print(f"simulators warmed (every target scraped once) in {warm_fleet(fleet):.0f}s", flush=True)
    return fleet
