"""Alerts-mode benchmark: healer's tick when Prometheus evaluates the rules (issue 19, item 2).

Run: ``python bench/alerts_bench.py [--nodes 2048] [--rounds 5] [--scrape-interval 15]
[--rule-interval 30] [--retention 1h]``

Starts ``healer simulate`` (``--nodes`` nodes x 8 GPUs x 8 HCAs, the demo scenario at 10x speed
so its faults are on within a minute) and a real Prometheus discovering its 2 x N targets through
file_sd and loading the default pack as ``healer rules export`` writes it (every group at
``--rule-interval``).

Each round waits until every group has been evaluated again, then runs one healer tick in alerts
mode (``run_detection`` with :class:`~healer.sources.alerts.PrometheusAlertsSource`: one request
to ``/api/v1/rules``, evaluation, recording into SQLite; the state carried from round to round) and
times it. Then, off the clock, query mode on the same data: for each group, its rules as instant
queries at that group's ``lastEvaluation`` (the time Prometheus evaluated them, read from the same
snapshot), from an empty state. Compared: the series whose condition holds (pending or firing, not
held by ``keep_firing_for`` or by a silent exporter) and the unknown nodes. A round whose groups
Prometheus evaluated again during the tick is not compared and is run again.

``--keep-pack-metrics``: the engine's scrape job keeps only the metrics the pack reads (the
``metric_relabel_configs`` of ``healer rules scrape-keep``), as a production Prometheus would;
the series offered and stored per node are printed once every target is up.

Prints per round and as medians: healer's tick (target < 1 s), the answer's size, the findings,
whether both modes agree, Prometheus's own evaluation time of the pack (the sum over groups), and
this process's peak RSS; exit 0 when the median tick is under 1 s and every round agrees.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import signal
import statistics
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
from healer.ruleset.export import prometheus_rule_file
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import RuleSet
from healer.sources.alerts import PrometheusAlertsSource, api_time
from healer.sources.prometheus import PrometheusSource
from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.bench_fleet import (
    Engine,
    add_fleet_arguments,
    pack_keep_list,
    process_rss_mib,
    scraped_samples,
    start_engine,
    start_warm_fleet,
    wait_for_targets,
)
from healer_dev.prometheus import wait_until

REPO = Path(__file__).resolve().parents[1]

Series = set[tuple[str, str]]


def peak_rss_mib() -> float:
    """Peak resident set size of this process, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rule_groups(url: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{url}/api/v1/rules", params={"type": "alert"}, timeout=60).json()
    return list(body["data"]["groups"])


def evaluations(groups: list[dict[str, Any]]) -> dict[str, str]:
    return {g["name"]: g["lastEvaluation"] for g in groups}


def active(result: DetectionResult) -> tuple[Series, frozenset[str]]:
    """Series whose condition holds at this tick (pending or firing, seen true now), unknown nodes."""
    found = [f for fs in (*result.findings.firing.values(), *result.findings.pending.values()) for f in fs]
    now = result.findings.at
    return {(f.rule, f.series_key) for f in found if f.last_true_at == now}, result.findings.unknown


def query_mode(url: str, ruleset: RuleSet, groups: list[dict[str, Any]]) -> tuple[Series, frozenset[str]]:
    """Each group's rules queried at the time Prometheus evaluated them, from an empty state."""
    at = {g["name"]: api_time(g["lastEvaluation"]) for g in groups}
    series: Series = set()
    unknown: set[str] = set()
    # VictoriaMetrics at 10,240 nodes: single rules over 2 minutes (its own limit: 300 s, VM_ARGS).
    with PrometheusSource(url, timeout_seconds=300, tick_deadline_seconds=1200) as source:
        for group in ruleset.groups:
            when = at[group.name]
            assert when is not None, f"group {group.name} not evaluated"
            result = run_detection(
                ruleset=RuleSet(groups=(group,)),
                source=source,
                session_factory=None,
                state=EvaluationState(),
                now=when,
            )
            bad = [
                f"{r.rule}: {r.health} {r.error}" for r in result.reports if r.health not in ("ok", "no_data")
            ]
            if bad:
                print("  query mode, unhealthy rules:", *bad, sep="\n    ")
            s, u = active(result)
            series |= s
            unknown |= u
    return series, frozenset(unknown)


def scale(answer: dict[str, Any], copies: int, now: datetime) -> dict[str, Any]:
    """``answer`` (an /api/v1/rules body) with each alert repeated ``copies`` times, the copies'
    node label values suffixed ``-copy<k>``, and every lastEvaluation set to ``now``."""
    out = json.loads(json.dumps(answer))
    stamp = now.isoformat().replace("+00:00", "Z")
    node_labels = {"Hostname", "hostname", "node", "kubernetes_node", "nodename"}
    for group in out["data"]["groups"]:
        group["lastEvaluation"] = stamp
        for rule in group["rules"]:
            rule["lastEvaluation"] = stamp
            alerts = []
            for alert in rule.get("alerts") or []:
                alerts.append(alert)
                for k in range(1, copies):
                    labels = {
                        n: (f"{v}-copy{k}" if n in node_labels else v) for n, v in alert["labels"].items()
                    }
                    alerts.append({**alert, "labels": labels})
            rule["alerts"] = alerts
    return out


def replay(path: Path, ruleset: RuleSet, copies: int, rounds: int) -> int:
    """``--from-answer``: healer's tick on a saved answer, scaled; exit 0 when its median is < 1 s."""
    work = Path(tempfile.mkdtemp(prefix="healer-alerts-replay-"))
    try:
        db = f"sqlite:///{work / 'healer.db'}"
        migrate.upgrade(db)
        engine = make_engine(db)
        figures = scaled_ticks(
            json.loads(path.read_text()), ruleset, make_sessionmaker(engine), copies, rounds
        )
        engine.dispose()
        print(json.dumps(figures))
        return 0 if figures["scaled_tick_ms"] < 1000 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def scaled_ticks(
    answer: dict[str, Any], ruleset: RuleSet, factory: Any, copies: int, rounds: int = 5
) -> dict[str, Any]:
    """Healer's tick against a loopback server answering ``answer`` scaled by ``copies``: healer's
    own cost (one request, parsing, evaluation, recording) for that many more alerts."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = b""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    times: list[float] = []
    cpu: list[float] = []
    state = EvaluationState()
    result: DetectionResult | None = None
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with PrometheusAlertsSource(url, timeout_seconds=30, tick_deadline_seconds=60) as source:
            for _ in range(rounds):
                now = datetime.now(UTC)
                body = json.dumps(scale(answer, copies, now)).encode()
                t0, c0 = time.perf_counter(), time.process_time()
                result = run_detection(
                    ruleset=ruleset, source=source, session_factory=factory, state=state, now=now
                )
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                state = result.state
    finally:
        server.shutdown()
        server.server_close()
    assert result is not None
    bad = [r.rule for r in result.reports if r.health not in ("ok", "no_data")]
    found = sum(len(v) for v in (*result.findings.firing.values(), *result.findings.pending.values()))
    median = statistics.median(times)
    print(
        f"the last answer x{copies} ({len(body) / 1024:.0f} KiB, {found} findings, unhealthy rules {bad}): "
        f"healer tick median of {rounds} {median * 1000:.1f} ms wall, "
        f"{statistics.median(cpu) * 1000:.1f} ms CPU "
        f"(first {times[0] * 1000:.1f} ms, recording the new findings)"
    )
    return {
        "scaled_copies": copies,
        "scaled_answer_kib": round(len(body) / 1024),
        "scaled_findings": found,
        "scaled_tick_ms": round(median * 1000, 1),
        "scaled_first_tick_ms": round(times[0] * 1000, 1),
        "scaled_tick_cpu_ms": round(statistics.median(cpu) * 1000, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrape-interval", type=int, default=15, help="seconds")
    parser.add_argument("--rule-interval", type=int, default=30, help="seconds between group evaluations")
    parser.add_argument("--retention", default="1h", help="Prometheus --storage.tsdb.retention.time")
    parser.add_argument("--rules", type=Path, default=REPO / "rules")
    parser.add_argument(
        "--save-answer", type=Path, help="write the last /api/v1/rules answer of the real run here"
    )
    parser.add_argument(
        "--from-answer",
        type=Path,
        help="no fleet, no Prometheus: time healer's tick against a loopback server answering this "
        "saved /api/v1/rules answer (see --save-answer), its alerts copied --copies times onto "
        "renamed nodes: healer's own side of a fleet that many times larger",
    )
    parser.add_argument("--copies", type=int, default=1, help="with --from-answer")
    parser.add_argument(
        "--engine",
        choices=["prometheus", "victoria-metrics"],
        default="prometheus",
        help="prometheus: Prometheus scrapes and evaluates; victoria-metrics: VictoriaMetrics scrapes "
        "and answers query mode, vmalert evaluates the pack (exported without keep_firing_for) and "
        "healer reads vmalert",
    )
    add_fleet_arguments(parser)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below on kill
    if args.from_answer:
        return replay(args.from_answer, load_ruleset([args.rules]), args.copies, args.rounds)
    healer = shutil.which("healer")
    if not healer:
        print("needs `healer` (pip install -e .) on PATH", file=sys.stderr)
        return 2

    ruleset = load_ruleset([args.rules])
    work = Path(tempfile.mkdtemp(prefix="healer-alerts-bench-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        fleet = start_warm_fleet(
            healer, nodes=args.nodes, workdir=work, processes=args.simulators, engine=args.engine, stack=stack
        )
        vm = args.engine == "victoria-metrics"
        exported = prometheus_rule_file(
            ruleset, default_interval_seconds=args.rule_interval, keep_firing_for=not vm
        )
        for group in exported["groups"]:
            group["interval"] = f"{args.rule_interval}s"
        (work / "healer.rules.yml").write_text(yaml.safe_dump(exported, sort_keys=False))
        started = time.monotonic()
        engine = start_engine(
            args.engine,
            stack,
            workdir=work,
            file_sd=fleet.file_sd,
            rule_file=work / "healer.rules.yml",
            scrape_interval=args.scrape_interval,
            rule_interval=args.rule_interval,
            prometheus_args=[f"--storage.tsdb.retention.time={args.retention}"],
            targets=2 * args.nodes,
            metric_relabel_configs=pack_keep_list(ruleset) if args.keep_pack_metrics else (),
        )
        return run(args, ruleset, work, engine, started)


def run(args: argparse.Namespace, ruleset: RuleSet, work: Path, engine: Engine, started: float) -> int:
    """The rounds (see the module docstring); prints the figures, returns the exit status.
    ``started``: ``time.monotonic()`` when the engine was started (for the time until every target
    is up and answers queries)."""
    prom_url, rules_url, evaluator = engine.query_url, engine.rules_url, engine.name
    targets = 2 * args.nodes
    print(
        f"fleet: {args.nodes} nodes x 8 GPUs x 8 HCAs ({targets} targets, {args.simulators} "
        f"simulator processes), demo scenario at 10x, scrape interval {args.scrape_interval}s"
    )
    print(
        f"rules: {len(ruleset.rules)} default rules in {len(ruleset.groups)} groups, exported, "
        f"evaluated by {evaluator} every {args.rule_interval}s; healer queries {args.engine}"
    )

    wait_for_targets(prom_url, targets, timeout=10 * args.scrape_interval + 900)
    queryable = time.monotonic() - started
    offered, kept = scraped_samples(prom_url)
    keep = "only the pack's metrics kept" if args.keep_pack_metrics else "every scraped series kept"
    print(
        f"all targets up and queryable {queryable:.0f}s after the engine started; series per scrape "
        f"round {offered:.0f} offered, {kept:.0f} stored ({keep}): {offered / args.nodes:.0f} and "
        f"{kept / args.nodes:.0f} per node, plus the engine's own per-target series"
    )

    def evaluated_after(previous: dict[str, str]) -> list[dict[str, Any]]:
        """The groups, once every one of them has been evaluated since ``previous``."""

        def fresh() -> list[dict[str, Any]] | None:
            groups = rule_groups(rules_url)
            now = evaluations(groups)
            done = all(now[n] != previous.get(n) and not now[n].startswith("0001") for n in now)
            return groups if done else None

        return list(
            wait_until(fresh, timeout=6 * args.rule_interval + 300, interval=0.5, what="group evaluations")
        )

    groups = evaluated_after({})
    if not engine.evaluates_full_fleet_first:
        groups = evaluated_after(evaluations(groups))  # every group evaluated once with every target up

    db = f"sqlite:///{work / 'healer.db'}"
    migrate.upgrade(db)
    store = make_engine(db)
    factory = make_sessionmaker(store)
    source = PrometheusAlertsSource(rules_url, timeout_seconds=30, tick_deadline_seconds=60)
    state = EvaluationState()
    ticks: list[float] = []
    cpus: list[float] = []
    agree: list[bool] = []
    prom_eval: list[float] = []
    sizes: list[int] = []
    loads: list[str] = []
    round_no = 0
    while round_no < args.rounds:
        groups = evaluated_after(evaluations(groups))
        before = evaluations(groups)
        size = len(httpx.get(f"{rules_url}/api/v1/rules", params={"type": "alert"}, timeout=60).content)
        now = datetime.now(UTC)
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_detection(ruleset=ruleset, source=source, session_factory=factory, state=state, now=now)
        tick = time.perf_counter() - t0
        tick_cpu = time.process_time() - c0
        state = result.state
        after_groups = rule_groups(rules_url)
        if evaluations(after_groups) != before:
            print(f"  ({evaluator} evaluated a group during the tick: round not compared, run again)")
            groups = after_groups
            continue
        round_no += 1
        bad = [f"{r.rule}: {r.health} {r.error}" for r in result.reports if r.health not in ("ok", "no_data")]
        if bad:
            print("  alerts mode, unhealthy rules:", *bad, sep="\n    ")
        alerts_series, alerts_unknown = active(result)
        query_series, query_unknown = query_mode(prom_url, ruleset, groups)
        same = alerts_series == query_series and alerts_unknown == query_unknown
        if not same:
            print(f"  alerts only: {sorted(alerts_series - query_series)[:5]}")
            print(f"  query only:  {sorted(query_series - alerts_series)[:5]}")
            print(f"  unknown: alerts {sorted(alerts_unknown)[:5]}, query {sorted(query_unknown)[:5]}")
        ticks.append(tick)
        cpus.append(tick_cpu)
        agree.append(same)
        sizes.append(size)
        prom_eval.append(pack_evaluation(groups))
        loads.append(" ".join(Path("/proc/loadavg").read_text().split()[:3]))
        firing = sum(len(v) for v in result.findings.firing.values())
        pending = sum(len(v) for v in result.findings.pending.values())
        print(
            f"round {round_no}: healer tick {tick * 1000:7.1f} ms ({tick_cpu * 1000:.1f} ms CPU; "
            f"1 request, {size / 1024:.0f} KiB) | "
            f"{firing} firing, {pending} pending, {len(result.findings.unknown)} unknown nodes | "
            f"same as query mode: {same} ({len(alerts_series)} series) | "
            f"{evaluator}'s evaluation of the pack {prom_eval[-1]:.2f} s | load {loads[-1]}"
        )
    source.close()
    if args.save_answer:
        answer = httpx.get(f"{rules_url}/api/v1/rules", params={"type": "alert"}, timeout=120)
        args.save_answer.write_bytes(answer.content)
    store.dispose()
    median = statistics.median(ticks)
    prom_rss = process_rss_mib(engine.pid)
    prom_peak = process_rss_mib(engine.pid, "VmHWM")
    print()
    print(
        f"healer tick in alerts mode (median of {len(ticks)}): {median * 1000:.1f} ms wall, "
        f"{statistics.median(cpus) * 1000:.1f} ms CPU  (target < 1 s)"
    )
    print(f"same findings as query mode on the same data: {sum(agree)} of {len(agree)} rounds")
    print(f"{evaluator}'s own evaluation of the pack (median): {statistics.median(prom_eval):.2f} s")
    print(
        f"healer peak RSS: {peak_rss_mib():.0f} MiB; {args.engine} RSS: {prom_rss:.0f} MiB "
        f"(peak {prom_peak:.0f} MiB)"
    )
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "engine": args.engine,
                "keep_pack_metrics": args.keep_pack_metrics,
                "series_per_node_offered": round(offered / args.nodes, 1),
                "series_per_node_stored": round(kept / args.nodes, 1),
                "queryable_after_s": round(queryable),
                "rules": len(ruleset.rules),
                "alerts_tick_ms": round(median * 1000, 1),
                "alerts_tick_cpu_ms": round(statistics.median(cpus) * 1000, 1),
                "answer_kib": round(statistics.median(sizes) / 1024),
                "same_findings_as_query_mode": all(agree),
                "engine_pack_evaluation_s": round(statistics.median(prom_eval), 2),
                "peak_rss_mib": round(peak_rss_mib()),
                "engine_rss_mib": round(prom_rss),
                "engine_peak_rss_mib": round(prom_peak),
                "load_averages": loads,
            }
        )
    )
    return 0 if median < 1.0 and all(agree) else 1


def pack_evaluation(groups: list[dict[str, Any]]) -> float:
    """The engine's own evaluation time of the pack, seconds: the sum over groups (vmalert 1.79
    reports no group time: the sum of its rules' times)."""
    return sum(
        float(g["evaluationTime"])
        if "evaluationTime" in g
        else sum(float(r["evaluationTime"]) for r in g.get("rules") or [])
        for g in groups
    )


if __name__ == "__main__":
    sys.exit(main())
