"""Fleet simulator benchmark: scrape render time per node and for a whole 2,048-node fleet, and the RSS.

Run: ``python bench/simulator_bench.py [--nodes 2048] [--rounds 3] [--http 2000]``

Prints, for the demo scenario on ``--nodes`` nodes:

* render time of one node's dcgm-exporter scrape and node_exporter scrape (median over the fleet),
* the time to render every node's two scrapes once (a full-fleet scrape round, best of ``--rounds``),
  the first (cold: templates built) round separately,
* HTTP: ``--http`` scrapes of a ``healer simulate`` process over keep-alive connections, and that
  process's CPU time per scrape and RSS,
* the process's resident memory after all templates are cached.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from healer_dev.prometheus import free_port, wait_until
from healer_dev.simulator import Fleet, FleetConfig, load_scenario


def rss_mib() -> float:
    """Current resident set size of this process, MiB (from /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--http", type=int, default=2000, help="scrapes through HTTP (0 = skip)")
    args = parser.parse_args(argv)

    rss0 = rss_mib()
    t0 = time.perf_counter()
    fleet = Fleet(FleetConfig(nodes=args.nodes, seed=1), load_scenario("demo"))
    build = time.perf_counter() - t0
    names = fleet.node_names
    print(f"fleet: {args.nodes} nodes x 8 GPUs x 8 HCAs, demo scenario; built in {build:.2f} s")

    def full_round(t: float) -> tuple[float, list[float], list[float], int]:
        dcgm_times, node_times, size = [], [], 0
        start = time.perf_counter()
        for name in names:
            a = time.perf_counter()
            body = fleet.render_dcgm(name, t)
            b = time.perf_counter()
            body2 = fleet.render_node(name, t)
            c = time.perf_counter()
            dcgm_times.append(b - a)
            node_times.append(c - b)
            size += len(body) + len(body2)
        return time.perf_counter() - start, dcgm_times, node_times, size

    cold, _, _, size = full_round(10.0)
    print(f"cold round (templates built): {cold:.2f} s; {size / len(names) / 1024:.1f} KiB per node")
    rounds = [full_round(200.0 + 15 * r) for r in range(args.rounds)]
    best = min(rounds, key=lambda r: r[0])
    total, dcgm_times, node_times, size = best
    series = sum(body.count("\n") for body in (fleet.render_dcgm(names[0], 1.0),))
    print(
        f"per node: dcgm-exporter {statistics.median(dcgm_times) * 1e6:.0f} us "
        f"(p99 {sorted(dcgm_times)[int(len(dcgm_times) * 0.99)] * 1e6:.0f} us, ~{series} lines), "
        f"node_exporter {statistics.median(node_times) * 1e6:.0f} us"
    )
    print(
        f"whole fleet: {total:.2f} s for {2 * len(names)} scrapes ({size / 1e6:.1f} MB of text); "
        f"that is {total / 30 * 100:.1f} % of one core at a 30 s scrape interval"
    )
    print(f"RSS: {rss_mib():.0f} MiB (was {rss0:.0f} MiB before building the fleet)")

    if args.http:
        http_bench(args.nodes, args.http)
    return 0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_bench(nodes: int, scrapes: int) -> None:
    """Scrape a ``healer simulate`` process over keep-alive HTTP; report its CPU time per scrape."""
    port = free_port()
    cmd = [sys.executable, "-c", "from healer.cli import app; app()", "simulate"]
    cmd += ["--nodes", str(nodes), "--port", str(port), "--scenario", "demo", "--seed", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200, what="simulator up")
        names = [f"gpu-node-{i:02d}" for i in range(nodes)]
        paths = [f"/nodes/{n}/{e}/metrics" for n in names for e in ("dcgm", "node")]
        paths = (paths * (scrapes // len(paths) + 1))[:scrapes]
        # warm the templates, as a running simulator has them after its first scrape round
        with httpx.Client(base_url=url, timeout=30) as client:
            for p in paths[: 2 * nodes]:
                client.get(p)
        workers = 8
        chunks = [paths[i::workers] for i in range(workers)]

        def fetch(chunk: list[str]) -> int:
            with httpx.Client(base_url=url, timeout=30) as client:
                for p in chunk:
                    client.get(p).raise_for_status()
            return len(chunk)

        cpu0, start = _cpu_seconds(proc.pid), time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            done = sum(pool.map(fetch, chunks))
        elapsed, cpu = time.perf_counter() - start, _cpu_seconds(proc.pid) - cpu0
        rss = int(
            next(
                x for x in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if x.startswith("VmRSS")
            ).split()[1]
        )
        per = cpu / done
        print(
            f"HTTP (healer simulate in its own process, {workers} keep-alive clients): {done} scrapes in "
            f"{elapsed:.2f} s wall; server CPU {per * 1e3:.2f} ms per scrape "
            f"= {1 / per:.0f} scrapes/s per core; "
            f"a {nodes}-node fleet (2 targets per node) at a 30 s interval needs {2 * nodes / 30:.0f}/s"
        )
        print(f"simulator process RSS: {rss / 1024:.0f} MiB")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
