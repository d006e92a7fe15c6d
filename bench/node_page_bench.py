"""Node page latency with a real Prometheus holding a whole fleet: the page's chart queries each
rule's input series narrowed to the node, not the rule across the fleet.

Starts ``healer simulate --nodes 2048 --scenario demo --speed 10`` (every demo fault on within a
minute) and a real Prometheus scraping its 4,096 targets (only the metrics the default pack reads:
``healer rules scrape-keep``), seeds each demo fault's finding (the labels the simulator
exports), incident and cordon into SQLite as the controller records them, and serves the
real app (``healer.wiring.dashboard``) with uvicorn. Each round GETs every faulty node's page
``--requests`` times (after warm-up), records the load average, and times the chart's queries
both ways: narrowed to the node (what the page sends) and, once, fleet-wide (what it sent before,
filtering the node's series out of the answer).

Prints per round and overall p50/p95 per node page; exits 1 when the overall p95 of a node page is
at or above ``--target-ms`` (200 ms). Needs ``prometheus`` (Debian package) and ``healer`` on PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api import charts
from api.rule_query import rule_query
from healer.config import load_settings
from healer.errors import SourceError
from healer.model.states import NodeState
from healer.ruleset.loading import load_ruleset
from healer.sources.prometheus_range import PrometheusRange, step_for
from healer.store import migrate
from healer.store import nodes as repo
from healer.store.models import Finding, Incident
from healer.store.session import make_engine, make_sessionmaker
from healer.wiring import dashboard
from healer_dev.bench_fleet import pack_keep_list, start_engine, start_warm_fleet, wait_for_targets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dashboard_bench import p95, serve  # the dashboard bench's uvicorn and p95

REPO = Path(__file__).resolve().parents[1]
#: The demo's faults (healer_dev/simulator/scenarios/demo.yaml): node, the rule it fires and the
#: labels of its finding as the simulator exports them.
FAULTS: dict[str, tuple[str, dict[str, str]]] = {
    "gpu-node-07": ("GpuTooHot", {"Hostname": "gpu-node-07", "gpu": "3"}),
    "gpu-node-12": ("GpuFatalXid", {"Hostname": "gpu-node-12", "gpu": "5"}),
    "gpu-node-23": ("NvlinkErrorBurst", {"Hostname": "gpu-node-23", "gpu": "2"}),
    "gpu-node-31": ("InfinibandLinkDowned", {"node": "gpu-node-31", "device": "mlx5_4", "port": "1"}),
    "gpu-node-40": ("GpuSilentThrottling", {"Hostname": "gpu-node-40", "gpu": "6"}),
}


Sessions = sessionmaker[Session]


def _seed(factory: Sessions) -> None:
    """Each faulty node as the controller leaves it: the fault's finding (labels as the simulator
    exports them), an incident following its rule, the node quarantined with a cordon."""
    now = datetime.now(UTC)
    with factory() as s, s.begin():
        for name, (rule, labels) in FAULTS.items():
            s.add(
                Finding(
                    rule=rule,
                    series_key=f"{rule}|{name}",
                    node_name=name,
                    gpu=labels.get("gpu"),
                    state="firing",
                    value=1.0,
                    labels=labels,
                    summary=f"{rule} on {name}",
                    active_since=now - timedelta(minutes=2),
                    fired_at=now - timedelta(minutes=1),
                    resolved_at=None,
                    last_seen_at=now,
                )
            )
            s.flush()
            node = repo.get_or_create_node(s, name, now=now)
            incident = repo.ensure_incident(s, node, now=now - timedelta(minutes=1), summary=f"{rule} firing")
            s.execute(update(Incident).where(Incident.id == incident.id).values(rule=rule))
            repo.attach_findings(s, node, incident)
            repo.transition(s, node, NodeState.QUARANTINED, now=now, actor="healer", reason=rule)
            repo.record_action(s, kind="cordon", status="succeeded", actor="healer", now=now, node=node)


def _query_ms(prom: PrometheusRange, expr: str, start: datetime, end: datetime) -> float:
    """Milliseconds of one range query; ``inf`` when it failed or ran past the client's timeout."""
    began = time.perf_counter()
    try:
        prom.query_range(expr, start=start, end=end, step_seconds=step_for(start, end))
    except SourceError as exc:
        print(f"  query failed after {time.perf_counter() - began:.1f}s: {exc}", flush=True)
        return math.inf
    return (time.perf_counter() - began) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20, help="measured GETs per node page and round")
    parser.add_argument("--scrape-interval", type=int, default=15)
    parser.add_argument("--simulators", type=int, default=1)
    parser.add_argument("--target-ms", type=float, default=200.0)
    args = parser.parse_args(argv)
    healer = shutil.which("healer")
    if not healer or not shutil.which("prometheus"):
        print("needs `healer` (pip install -e .) and `prometheus` on PATH", file=sys.stderr)
        return 2
    ruleset = load_ruleset([REPO / "rules"])
    work = Path(tempfile.mkdtemp(prefix="healer-bench-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        fleet = start_warm_fleet(
            healer,
            nodes=args.nodes,
            workdir=work,
            processes=args.simulators,
            engine="prometheus",
            stack=stack,
        )
        empty = work / "none.rules.yml"
        empty.write_text("groups: []\n")
        engine = start_engine(
            "prometheus",
            stack,
            workdir=work,
            file_sd=fleet.file_sd,
            rule_file=empty,
            scrape_interval=args.scrape_interval,
            rule_interval=60,
            metric_relabel_configs=pack_keep_list(ruleset),
        )
        waited = wait_for_targets(engine.query_url, 2 * args.nodes, timeout=600)
        print(f"{2 * args.nodes} targets up after {waited:.0f}s", flush=True)
        time.sleep(3 * args.scrape_interval)  # the demo's faults are on and scraped a few times
        db = f"sqlite:///{work / 'healer.db'}"
        migrate.upgrade(db)
        db_engine = make_engine(db)
        stack.callback(db_engine.dispose)
        factory = make_sessionmaker(db_engine)
        _seed(factory)
        rules = {name: rule for name, (rule, _) in FAULTS.items()}
        settings = load_settings(
            database={"url": db},
            prometheus={"url": engine.query_url, "timeout_seconds": 10.0},
            api={"anonymous_role": "viewer"},
        )
        app = dashboard(settings, factory, ruleset_provider=lambda: ruleset)
        prom = PrometheusRange(engine.query_url, timeout_seconds=30)
        pages: dict[str, list[float]] = {n: [] for n in rules}
        scoped: list[float] = []
        fleet_wide: list[float] = []
        with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
            for round_ in range(1, args.rounds + 1):
                load = os.getloadavg()[0]
                line = []
                for name, rule in rules.items():
                    for n in range(3 + args.requests):
                        t0 = time.perf_counter()
                        r = client.get(f"/nodes/{name}")
                        ms = (time.perf_counter() - t0) * 1000
                        if r.status_code != 200 or 'data-testid="chart"' not in r.text:
                            raise SystemExit(f"/nodes/{name}: HTTP {r.status_code}, no chart: {r.text[:300]}")
                        if n >= 3:
                            pages[name].append(ms)
                    times = pages[name][-args.requests :]
                    line.append(f"{name} p50 {statistics.median(times):.0f} ms")
                    end = datetime.now(UTC)
                    start = end - timedelta(minutes=5)
                    rq = charts.chart_query(ruleset.rule(rule), node=name, finding_labels=FAULTS[name][1])
                    scoped.append(_query_ms(prom, rq.series, start, end))
                    if round_ == 1:  # the fleet-wide query once per node: it is the slow one
                        wide = rule_query(ruleset.rule(rule).expr).series
                        fleet_wide.append(_query_ms(prom, wide, start, end))
                        print(f"  {rule} fleet-wide: {fleet_wide[-1]:.0f} ms", flush=True)
                print(f"round {round_} (load average {load:.2f}): " + "; ".join(line), flush=True)
    rows = [(n, statistics.median(t), p95(t)) for n, t in pages.items()]
    print()
    print(f"{args.nodes:,} nodes, {args.rounds} rounds x {args.requests} GETs per node page")
    print("node page              rule                    p50 ms   p95 ms")
    for name, p50, p in rows:
        print(f"{name:<22} {rules[name]:<22} {p50:8.1f} {p:8.1f}")
    print(
        f"chart query narrowed to the node: median {statistics.median(scoped):.1f} ms; "
        f"the same rule fleet-wide: median {statistics.median(fleet_wide):.1f} ms"
    )
    worst = max(p for _, _, p in rows)
    verdict = "ok" if worst < args.target_ms else "SLOW"
    print(f"worst p95 {worst:.1f} ms (target < {args.target_ms:.0f} ms): {verdict}")
    return 0 if worst < args.target_ms else 1


if __name__ == "__main__":
    raise SystemExit(main())
