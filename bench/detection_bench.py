"""Detection benchmark: healer's tick beside Prometheus's own evaluation of the same rules.

Run: ``python bench/detection_bench.py [--nodes 2048] [--rounds 5] [--scrape-interval 15]
[--rule-interval 30]``

Starts ``healer simulate`` (``--nodes`` nodes x 8 GPUs x 8 HCAs, the demo scenario at 10x speed
so its faults are on within a minute) and a real Prometheus discovering the simulator's 2 x N
targets through file_sd. Prometheus also loads every default rule as ONE alerting rule group (the
same PromQL, via ``to_prometheus_rules``), so ``prometheus_rule_group_last_duration_seconds`` is
its sequential evaluation of exactly what healer queries.

Each round waits for a fresh evaluation of that group, reads its duration, then runs one healer
detection tick (``run_detection``: one instant query per rule, ``--concurrency`` at a time,
evaluation, recording into a SQLite file) between two group evaluations, so both see the same
data and the same scrape load, then the same tick one query at a time (same state, same time,
nothing recorded) to check the findings are identical. Prints the medians, their ratio (target
<= 0.6), the sequential tick's time, the queries per tick (must equal the rules),
the slowest rules on both sides, and this process's peak RSS (target < 300 MB).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from healer.detection import DetectionResult, run_detection
from healer.engine.evaluation import EvaluationState
from healer.ruleset.loading import load_ruleset, to_prometheus_rules
from healer.sources.prometheus import PrometheusSource
from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.prometheus import free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
GROUP = "healer-default-rules"


def peak_rss_mib() -> float:
    """Peak resident set size of this process, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prometheus_metric(url: str, name: str, **labels: str) -> float | None:
    """One sample from Prometheus's own /metrics (text format), or None."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    return None


def rule_group(url: str) -> dict[str, Any]:
    groups = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    return next(g for g in groups if g["name"] == GROUP)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrape-interval", type=int, default=15, help="seconds")
    parser.add_argument(
        "--rule-interval",
        type=int,
        default=30,
        help="seconds between Prometheus's group evaluations; healer ticks in between, so keep it "
        "above twice the evaluation time or the two overlap",
    )
    parser.add_argument("--rules", type=Path, default=REPO / "rules")
    parser.add_argument("--concurrency", type=int, default=4, help="queries of one tick in flight at once")
    args = parser.parse_args(argv)
    prometheus = shutil.which("prometheus")
    healer = shutil.which("healer")
    if not prometheus or not healer:
        print("needs `prometheus` (Debian package) and `healer` (pip install -e .) on PATH", file=sys.stderr)
        return 2

    ruleset = load_ruleset([args.rules])
    rules = ruleset.rules
    work = Path(tempfile.mkdtemp(prefix="healer-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sim_port = free_port()
        sd = work / "targets.json"
        procs.append(
            subprocess.Popen(
                [
                    healer,
                    "simulate",
                    f"--nodes={args.nodes}",
                    f"--port={sim_port}",
                    "--scenario=demo",
                    "--speed=10",
                    f"--file-sd={sd}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(work / "simulator.log").open("wb"),
            )
        )
        wait_until(lambda: sd.is_file(), timeout=120, what="simulator file_sd")

        one_group = {
            "groups": [
                {
                    "name": GROUP,
                    "interval": f"{args.rule_interval}s",
                    "rules": [r for g in to_prometheus_rules(ruleset)["groups"] for r in g["rules"]],
                }
            ]
        }
        (work / "rules.yml").write_text(yaml.safe_dump(one_group, sort_keys=False))
        config = {
            "global": {
                "scrape_interval": f"{args.scrape_interval}s",
                "evaluation_interval": f"{args.rule_interval}s",
            },
            "rule_files": [str(work / "rules.yml")],
            "scrape_configs": [{"job_name": "simulator", "file_sd_configs": [{"files": [str(sd)]}]}],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_port = free_port()
        prom_url = f"http://127.0.0.1:{prom_port}"
        procs.append(
            subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(work / "prometheus.log").open("wb"),
            )
        )
        wait_until(lambda: httpx.get(f"{prom_url}/-/ready", timeout=2).status_code == 200, timeout=60)
        targets = 2 * args.nodes
        print(f"fleet: {args.nodes} nodes x 8 GPUs x 8 HCAs ({targets} targets), demo scenario at 10x")
        print(
            f"rules: {len(rules)} default rules, "
            f"evaluated by Prometheus as one group every {args.rule_interval}s"
        )

        def targets_up() -> bool:
            r = httpx.get(f"{prom_url}/api/v1/query", params={"query": "count(up == 1)"}, timeout=30).json()
            result = r["data"]["result"]
            return bool(result) and int(float(result[0]["value"][1])) >= targets

        started = time.monotonic()
        wait_until(
            targets_up, timeout=10 * args.scrape_interval + 120, interval=2, what=f"{targets} targets up"
        )
        head = prometheus_metric(prom_url, "prometheus_tsdb_head_series") or 0.0
        print(f"all targets up after {time.monotonic() - started:.0f}s; head series: {head:.0f}")

        migrate.upgrade(f"sqlite:///{work / 'healer.db'}")
        engine = make_engine(f"sqlite:///{work / 'healer.db'}")
        factory = make_sessionmaker(engine)
        source = PrometheusSource(prom_url, timeout_seconds=30, tick_deadline_seconds=120)
        state = EvaluationState()

        def evaluated_after(t: str | None) -> str:
            return str(
                wait_until(
                    lambda: (g := rule_group(prom_url))["lastEvaluation"] != t and g["lastEvaluation"],
                    timeout=3 * args.rule_interval,
                    interval=0.2,
                    what="a rule group evaluation",
                )
            )

        last = evaluated_after(None)  # one full group evaluation with every target up
        last = evaluated_after(last)
        prom_times: list[float] = []
        healer_times: list[float] = []
        sequential_times: list[float] = []
        same_findings: list[bool] = []
        query_times: list[float] = []
        queries: set[int] = set()
        slowest_prom: dict[str, float] = {}
        slowest_healer: dict[str, float] = {}
        findings = 0
        for i in range(args.rounds):
            last = evaluated_after(last)
            duration = prometheus_metric(
                prom_url,
                "prometheus_rule_group_last_duration_seconds",
                rule_group=f"{work / 'rules.yml'};{GROUP}",
            )
            assert duration is not None, "prometheus_rule_group_last_duration_seconds not found"
            group = rule_group(prom_url)
            for r in group["rules"]:
                slowest_prom[r["name"]] = max(slowest_prom.get(r["name"], 0.0), float(r["evaluationTime"]))
            prom_times.append(duration)
            sent = source.queries_sent
            now = datetime.now(UTC)
            t0 = time.perf_counter()
            result = run_detection(
                ruleset=ruleset,
                source=source,
                session_factory=factory,
                state=state,
                now=now,
                concurrency=args.concurrency,
            )
            healer_times.append(time.perf_counter() - t0)
            queries.add(source.queries_sent - sent)
            # The same tick, one query at a time, from the same state at the same time: the
            # concurrent tick must find exactly what the sequential one finds.
            t0 = time.perf_counter()
            sequential = run_detection(
                ruleset=ruleset, source=source, session_factory=None, state=state, now=now, concurrency=1
            )
            sequential_times.append(time.perf_counter() - t0)
            same_findings.append(_found(sequential) == _found(result))
            state = result.state
            query_times.append(sum(r.duration_seconds for r in result.reports))
            for r in result.reports:
                slowest_healer[r.rule] = max(slowest_healer.get(r.rule, 0.0), r.duration_seconds)
            unhealthy = [
                f"{r.rule}: {r.health} {r.error}" for r in result.reports if r.health not in ("ok", "no_data")
            ]
            if unhealthy:
                print("  unhealthy rules:", *unhealthy, sep="\n    ")
            findings = sum(len(v) for v in result.findings.firing.values()) + sum(
                len(v) for v in result.findings.pending.values()
            )
            print(
                f"round {i + 1}: Prometheus group {duration * 1000:7.1f} ms | healer tick "
                f"{healer_times[-1] * 1000:7.1f} ms (sum of queries {query_times[-1] * 1000:7.1f} ms; "
                f"sequential tick {sequential_times[-1] * 1000:7.1f} ms, same findings {same_findings[-1]}), "
                f"{findings} findings, {len(result.findings.unknown)} unknown nodes"
            )
        source.close()
        engine.dispose()

        prom_median = statistics.median(prom_times)
        healer_median = statistics.median(healer_times)
        query_median = statistics.median(query_times)
        print()
        print(f"Prometheus rule group evaluation (median of {args.rounds}): {prom_median * 1000:8.1f} ms")
        print(f"healer detection tick            (median of {args.rounds}): {healer_median * 1000:8.1f} ms")
        print(f"  sum of its queries' times                          : {query_median * 1000:8.1f} ms")
        seq_median = statistics.median(sequential_times)
        print(f"the same tick one query at a time (median)           : {seq_median * 1000:8.1f} ms")
        print(
            f"concurrency {args.concurrency}: findings identical to the sequential tick in "
            f"{sum(same_findings)} of {len(same_findings)} rounds"
        )
        print(f"ratio healer / Prometheus: {healer_median / prom_median:.2f}  (target <= 0.6)")
        print(f"queries per tick: {sorted(queries)} for {len(rules)} rules  (target: exactly one per rule)")
        print(f"healer peak RSS: {peak_rss_mib():.0f} MiB  (target < 300 MB)")
        top = sorted(slowest_healer, key=slowest_healer.__getitem__, reverse=True)[:5]
        print("slowest rules (max over rounds), healer query vs Prometheus rule evaluation:")
        for name in top:
            print(
                f"  {name:32s} {slowest_healer[name] * 1000:8.1f} ms"
                f"  {slowest_prom.get(name, 0) * 1000:8.1f} ms"
            )
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "rules": len(rules),
                    "prometheus_ms": round(prom_median * 1000, 1),
                    "healer_tick_ms": round(healer_median * 1000, 1),
                    "ratio": round(healer_median / prom_median, 2),
                    "sequential_tick_ms": round(seq_median * 1000, 1),
                    "concurrency": args.concurrency,
                    "same_findings_as_sequential": all(same_findings),
                    "queries_per_tick": sorted(queries),
                    "peak_rss_mib": round(peak_rss_mib()),
                }
            )
        )
        ok = (
            healer_median <= 0.6 * prom_median
            and all(same_findings)
            and queries == {len(rules)}
            and peak_rss_mib() < 300
        )
        return 0 if ok else 1
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def _found(result: DetectionResult) -> tuple[set[tuple[str, str]], set[tuple[str, str]], frozenset[str]]:
    """(rule, series) firing, pending, and the unknown nodes: what a tick hands the lifecycle."""
    firing = {(f.rule, f.series_key) for fs in result.findings.firing.values() for f in fs}
    pending = {(f.rule, f.series_key) for fs in result.findings.pending.values() for f in fs}
    return firing, pending, result.findings.unknown


if __name__ == "__main__":
    sys.exit(main())
