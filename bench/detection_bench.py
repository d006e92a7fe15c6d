"""Detection benchmark: healer's tick beside Prometheus's own evaluation of the same rules.

Run: ``python bench/detection_bench.py [--nodes 2048] [--rounds 5] [--scrape-interval 15]
[--rule-interval 30] [--engine prometheus|victoria-metrics] [--simulators 1]``

Starts ``healer simulate`` (``--nodes`` nodes x 8 GPUs x 8 HCAs, the demo scenario at 10x speed
so its faults are on within a minute) and a real Prometheus discovering the simulator's 2 x N
targets through file_sd. Prometheus also loads every default rule as ONE alerting rule group (the
same PromQL, via ``to_prometheus_rules``), so ``prometheus_rule_group_last_duration_seconds`` is
its sequential evaluation of exactly what healer queries.

``--prometheus 3`` (or a path to a ``prometheus`` binary): that Prometheus instead of Debian's on
PATH (2.42); ``3`` is Prometheus 3.x as ``tests/prometheus3/build.sh`` builds it (built first when
missing). A Prometheus 3 runs with ``--enable-feature=concurrent-rule-eval``: the independent rules
of the one group (all of the pack's: none reads another's output) are evaluated
``--rules.max-concurrent-evals`` (default 4) at a time, so the group's duration is its concurrent
evaluation, as healer's tick is its concurrent queries.

``--engine victoria-metrics``: VictoriaMetrics (``-search.latencyOffset=0s``) scrapes the fleet
and answers healer's queries, and vmalert evaluates the same single group against it (the rules
exported without ``keep_firing_for``, which vmalert 1.79 rejects and which costs nothing to
evaluate); the group's time is vmalert's own iteration duration
(``vmalert_iteration_duration_seconds``, the difference of its ``_sum`` over one evaluation) and
the slowest rules its per-rule ``evaluationTime``. vmalert is a client of VictoriaMetrics' query
API as healer is, one query after another.

``--simulators N`` serves the fleet from N ``healer simulate`` processes (``healer_dev.bench_fleet``).
``--keep-pack-metrics``: the engine keeps only the metrics the pack reads (``healer rules
scrape-keep``'s ``metric_relabel_configs`` in its scrape job).

Each round waits for a fresh evaluation of that group, reads its duration, then runs one healer
detection tick (``run_detection``: one instant query per rule, ``--concurrency`` at a time,
evaluation, recording into a SQLite file) between two group evaluations, so both see the same
data and the same scrape load, then the same tick one query at a time (same state, same time,
nothing recorded) to check the findings are identical. Prints each round's ratio and the load
average, the median and spread of the per-round ratio (target <= 0.6) with the sequential tick's
ratio beside it, the queries per tick (must equal the rules),
the slowest rules on both sides, and this process's peak RSS (target < 300 MB).
"""

from __future__ import annotations

import abc
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
from healer.ruleset.loading import load_ruleset, to_prometheus_rules
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
from healer_dev.prometheus import prometheus3_bindir, prometheus_version, wait_until

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


class Evaluator(abc.ABC):
    """The engine's own evaluation of the one group: when it last ran, how long it took."""

    def last_evaluation(self) -> str:
        return str(rule_group(self.url)["lastEvaluation"])

    @abc.abstractmethod
    def duration(self) -> float:
        """Seconds of the last evaluation of the group (read right after it)."""

    def rule_times(self) -> dict[str, float]:
        """Each rule's evaluation time in the last evaluation, seconds."""
        return {r["name"]: float(r["evaluationTime"]) for r in rule_group(self.url)["rules"]}

    url: str


class PrometheusEvaluator(Evaluator):
    def __init__(self, url: str, rule_file: Path) -> None:
        self.url, self.rule_file = url, rule_file

    def duration(self) -> float:
        found = prometheus_metric(
            self.url, "prometheus_rule_group_last_duration_seconds", rule_group=f"{self.rule_file};{GROUP}"
        )
        assert found is not None, "prometheus_rule_group_last_duration_seconds not found"
        return found


class VmalertEvaluator(Evaluator):
    """vmalert's iteration time: the growth of ``vmalert_iteration_duration_seconds_sum`` over one
    iteration (its quantiles are over a window, not the last one)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._seen = self._iterations()

    def _iterations(self) -> tuple[float, float]:
        total = prometheus_metric(self.url, "vmalert_iteration_duration_seconds_sum", group=GROUP) or 0.0
        count = prometheus_metric(self.url, "vmalert_iteration_duration_seconds_count", group=GROUP) or 0.0
        return total, count

    def duration(self) -> float:
        total, count = wait_until(
            lambda: (now := self._iterations())[1] > self._seen[1] and now, timeout=30, what="vmalert metrics"
        )
        before_total, before_count = self._seen
        self._seen = (total, count)
        return float(total - before_total) / float(count - before_count)


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
        help="seconds between the engine's group evaluations; healer ticks in between, so keep it "
        "above twice the evaluation time or the two overlap",
    )
    parser.add_argument("--rules", type=Path, default=REPO / "rules")
    parser.add_argument("--concurrency", type=int, default=4, help="queries of one tick in flight at once")
    parser.add_argument(
        "--engine",
        choices=["prometheus", "victoria-metrics"],
        default="prometheus",
        help="prometheus: Prometheus scrapes and evaluates; victoria-metrics: VictoriaMetrics scrapes "
        "and answers, vmalert evaluates",
    )
    parser.add_argument(
        "--prometheus",
        default="2",
        help="with --engine prometheus: 2 (Debian's on PATH), 3 (tests/prometheus3/build.sh's, with "
        "--enable-feature=concurrent-rule-eval) or the path of a prometheus binary",
    )
    add_fleet_arguments(parser)
    parser.add_argument(
        "--no-sequential",
        action="store_true",
        help="skip the tick one query at a time (halves a round where one evaluation takes minutes)",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below on kill
    healer = shutil.which("healer")
    if not healer:
        print("needs `healer` (pip install -e .) on PATH", file=sys.stderr)
        return 2

    ruleset = load_ruleset([args.rules])
    prometheus, prometheus_args = _prometheus(args.prometheus)
    work = Path(tempfile.mkdtemp(prefix="healer-bench-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        fleet = start_warm_fleet(
            healer, nodes=args.nodes, workdir=work, processes=args.simulators, engine=args.engine, stack=stack
        )
        exported = [r for g in to_prometheus_rules(ruleset)["groups"] for r in g["rules"]]
        if args.engine == "victoria-metrics":
            exported = [{k: v for k, v in r.items() if k != "keep_firing_for"} for r in exported]
        one_group = {"groups": [{"name": GROUP, "interval": f"{args.rule_interval}s", "rules": exported}]}
        (work / "rules.yml").write_text(yaml.safe_dump(one_group, sort_keys=False))
        engine = start_engine(
            args.engine,
            stack,
            workdir=work,
            file_sd=fleet.file_sd,
            rule_file=work / "rules.yml",
            scrape_interval=args.scrape_interval,
            rule_interval=args.rule_interval,
            targets=2 * args.nodes,
            metric_relabel_configs=pack_keep_list(ruleset) if args.keep_pack_metrics else (),
            prometheus_binary=prometheus,
            prometheus_args=prometheus_args,
        )
        if args.engine == "prometheus" and prometheus:
            engine.name = f"Prometheus {prometheus_version(prometheus)}"
            print(f"engine: {prometheus} {' '.join(prometheus_args)}")
        evaluator: Evaluator = (
            VmalertEvaluator(engine.rules_url)
            if args.engine == "victoria-metrics"
            else PrometheusEvaluator(engine.rules_url, work / "rules.yml")
        )
        return run(args, ruleset, work, engine, evaluator)


def run(
    args: argparse.Namespace,
    ruleset: Any,
    work: Path,
    engine_info: Engine,
    evaluator: Evaluator,
) -> int:
    """The rounds (see the module docstring); prints the figures, returns the exit status."""
    rules = ruleset.rules
    query_url, engine_pid, engine_name = engine_info.query_url, engine_info.pid, engine_info.name
    targets = 2 * args.nodes
    print(
        f"fleet: {args.nodes} nodes x 8 GPUs x 8 HCAs ({targets} targets, {args.simulators} simulator "
        f"processes), demo scenario at 10x; engine {args.engine}, scrape interval {args.scrape_interval}s"
    )
    print(
        f"rules: {len(rules)} default rules, evaluated by {engine_name} as one group "
        f"every {args.rule_interval}s"
    )

    waited = wait_for_targets(query_url, targets, timeout=10 * args.scrape_interval + 600)
    # From the engine's own /metrics: a query counting every series ran past 120 s at 10,240 nodes.
    series = prometheus_metric(query_url, "prometheus_tsdb_head_series") or prometheus_metric(
        query_url, "vm_new_timeseries_created_total"
    )
    offered, kept = scraped_samples(query_url)
    print(
        f"all targets up after {waited:.0f}s; series: {series or 0:.0f}; per scrape round "
        f"{offered / args.nodes:.0f} series per node offered, {kept / args.nodes:.0f} stored"
        + (" (--keep-pack-metrics)" if args.keep_pack_metrics else "")
    )

    migrate.upgrade(f"sqlite:///{work / 'healer.db'}")
    engine = make_engine(f"sqlite:///{work / 'healer.db'}")
    factory = make_sessionmaker(engine)
    source = PrometheusSource(query_url, timeout_seconds=300, tick_deadline_seconds=600)
    state = EvaluationState()

    def evaluated_after(t: str | None) -> str:
        return str(
            wait_until(
                lambda: (e := evaluator.last_evaluation()) != t and not e.startswith("0001") and e,
                timeout=6 * args.rule_interval + 300,
                interval=0.2,
                what="a rule group evaluation",
            )
        )

    last = evaluated_after(None)
    if not engine_info.evaluates_full_fleet_first:
        last = evaluated_after(last)  # one full group evaluation with every target up
    evaluator.duration()
    prom_times: list[float] = []
    healer_times: list[float] = []
    sequential_times: list[float] = []
    same_findings: list[bool] = []
    query_times: list[float] = []
    rule_sums: list[float] = []
    loads: list[str] = []
    queries: set[int] = set()
    slowest_prom: dict[str, float] = {}
    slowest_healer: dict[str, float] = {}
    findings = 0
    for i in range(args.rounds):
        last = evaluated_after(last)
        duration = evaluator.duration()
        times = evaluator.rule_times()
        for name, seconds in times.items():
            slowest_prom[name] = max(slowest_prom.get(name, 0.0), seconds)
        # Above the group's duration when the engine evaluated rules concurrently (Prometheus 3).
        rule_sums.append(sum(times.values()))
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
        if not args.no_sequential:
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
        loads.append(load_average())
        print(
            f"round {i + 1}: {engine_name} group {duration * 1000:7.1f} ms (sum of its rules "
            f"{rule_sums[-1] * 1000:7.1f} ms) | healer tick "
            f"{healer_times[-1] * 1000:7.1f} ms (sum of queries {query_times[-1] * 1000:7.1f} ms; "
            + (
                f"sequential tick {sequential_times[-1] * 1000:7.1f} ms, same findings {same_findings[-1]}), "
                if sequential_times
                else "no sequential tick), "
            )
            + f"{findings} findings, {len(result.findings.unknown)} unknown nodes | ratio "
            f"{healer_times[-1] / duration:.2f}"
            + (f", sequential {sequential_times[-1] / duration:.2f}" if sequential_times else "")
            + f" | load {loads[-1]}"
        )
    source.close()
    engine.dispose()

    prom_median = statistics.median(prom_times)
    healer_median = statistics.median(healer_times)
    # The ratio is taken round by round (both sides under the same load at the same moment), then
    # its median and spread; the ratio of the two medians would mix rounds.
    ratios = [h / p for h, p in zip(healer_times, prom_times, strict=True)]
    sequential_ratios = [s / p for s, p in zip(sequential_times, prom_times, strict=True)]
    ratio = statistics.median(ratios)
    query_median = statistics.median(query_times)
    engine_rss = process_rss_mib(engine_pid)
    engine_peak = process_rss_mib(engine_pid, "VmHWM")
    print()
    print(f"{engine_name} rule group evaluation (median of {args.rounds}): {prom_median * 1000:8.1f} ms")
    print(f"healer detection tick            (median of {args.rounds}): {healer_median * 1000:8.1f} ms")
    print(f"  sum of its queries' times                          : {query_median * 1000:8.1f} ms")
    seq_median = statistics.median(sequential_times) if sequential_times else float("nan")
    print(f"the same tick one query at a time (median)           : {seq_median * 1000:8.1f} ms")
    print(
        f"concurrency {args.concurrency}: findings identical to the sequential tick in "
        f"{sum(same_findings)} of {len(same_findings)} rounds"
    )
    print(
        f"ratio healer / {engine_name}, per round: median {ratio:.2f}, spread "
        f"{min(ratios):.2f}-{max(ratios):.2f}  (target <= 0.6)"
    )
    if sequential_ratios:
        print(
            f"  the same, one query at a time: median {statistics.median(sequential_ratios):.2f}, "
            f"spread {min(sequential_ratios):.2f}-{max(sequential_ratios):.2f}"
        )
    print(f"queries per tick: {sorted(queries)} for {len(rules)} rules  (target: exactly one per rule)")
    print(
        f"healer peak RSS: {peak_rss_mib():.0f} MiB  (target < 300 MB); "
        f"{args.engine} RSS {engine_rss:.0f} MiB (peak {engine_peak:.0f} MiB)"
    )
    top = sorted(slowest_healer, key=slowest_healer.__getitem__, reverse=True)[:5]
    print(f"slowest rules (max over rounds), healer query vs {engine_name} rule evaluation:")
    for name in top:
        print(
            f"  {name:32s} {slowest_healer[name] * 1000:8.1f} ms  {slowest_prom.get(name, 0) * 1000:8.1f} ms"
        )
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "engine": args.engine,
                "engine_name": engine_name,
                "keep_pack_metrics": args.keep_pack_metrics,
                "series_per_node_offered": round(offered / args.nodes, 1),
                "series_per_node_stored": round(kept / args.nodes, 1),
                "rules": len(rules),
                "engine_group_ms": round(prom_median * 1000, 1),
                "engine_rule_sum_ms": round(statistics.median(rule_sums) * 1000, 1),
                "healer_tick_ms": round(healer_median * 1000, 1),
                "ratio": round(ratio, 2),
                "ratios": [round(r, 2) for r in ratios],
                "sequential_ratio": (
                    round(statistics.median(sequential_ratios), 2) if sequential_ratios else None
                ),
                "sequential_tick_ms": round(seq_median * 1000, 1) if sequential_times else None,
                "concurrency": args.concurrency,
                "same_findings_as_sequential": all(same_findings) if same_findings else None,
                "queries_per_tick": sorted(queries),
                "peak_rss_mib": round(peak_rss_mib()),
                "engine_rss_mib": round(engine_rss),
                "engine_peak_rss_mib": round(engine_peak),
                "load_averages": loads,
            }
        )
    )
    ok = ratio <= 0.6 and all(same_findings) and queries == {len(rules)} and peak_rss_mib() < 300
    return 0 if ok else 1


def _prometheus(choice: str) -> tuple[str | None, list[str]]:
    """``--prometheus``: the binary (None: Debian's on PATH) and its extra flags (concurrent rule
    evaluation for a 3.x). Exits with a message when a 3.x cannot be built or found."""
    if choice == "2":
        return None, []
    if choice == "3":
        bindir = prometheus3_bindir(build=True)
        if bindir is None:
            raise SystemExit("--prometheus 3: tests/prometheus3/build.sh failed (needs Go; its output above)")
        binary = str(bindir / "prometheus")
    else:
        binary = choice
        if not Path(binary).is_file():
            raise SystemExit(f"--prometheus {choice}: no such file")
    major = int(prometheus_version(binary).split(".")[0])
    return binary, ["--enable-feature=concurrent-rule-eval"] if major >= 3 else []


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (``uptime``'s figures)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _found(result: DetectionResult) -> tuple[set[tuple[str, str]], set[tuple[str, str]], frozenset[str]]:
    """(rule, series) firing, pending, and the unknown nodes: what a tick hands the lifecycle."""
    firing = {(f.rule, f.series_key) for fs in result.findings.firing.values() for f in fs}
    pending = {(f.rule, f.series_key) for fs in result.findings.pending.values() for f in fs}
    return firing, pending, result.findings.unknown


if __name__ == "__main__":
    sys.exit(main())
