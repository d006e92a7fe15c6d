"""The backtest's replay core on a week of a 2,048-node fleet: ticks per second and peak memory.

Feeds :class:`healer.engine.replay.Replay` (evaluation, lifecycle, safety) the default rule pack and
synthetic per-tick query results: every node in the fleet query, one GPU per ``--fault-every``
nodes running hot for an hour at some point of the week. Prometheus's range queries are not part of
this figure (they are I/O, chunked by ``healer.sources.history``); this is the Python side that has
to keep up with them and stay bounded in memory.

    python bench/backtest_bench.py                  # 7 days at 30 s (20,160 ticks), 2,048 nodes
    python bench/backtest_bench.py --days 1         # quick look

Exit status 0 when peak RSS < 300 MB.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from healer.engine.backtest import summarize
from healer.engine.evaluation import QueryResult, Sample
from healer.engine.replay import Replay, ReplaySettings
from healer.ruleset.loading import load_ruleset

REPO = Path(__file__).resolve().parent.parent
START = datetime(2026, 11, 23, tzinfo=UTC)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--step", type=float, default=30.0, help="seconds between ticks")
    parser.add_argument("--fault-every", type=int, default=64, help="one hot node per this many nodes")
    args = parser.parse_args()

    ruleset = load_ruleset([REPO / "rules"], promtool=False)
    nodes = [f"gpu-node-{i:04d}" for i in range(args.nodes)]
    ticks = int(args.days * 86400 / args.step) + 1
    faulty = nodes[:: args.fault_every]
    # Each faulty node is hot for one hour, the hours spread over the window.
    windows = {
        node: (i * ticks // max(len(faulty), 1), i * ticks // max(len(faulty), 1) + int(3600 / args.step))
        for i, node in enumerate(faulty)
    }
    empty = QueryResult(samples=[])
    replay = Replay(ruleset, ReplaySettings())
    began = time.perf_counter()
    for i in range(ticks):
        hot = [
            Sample({"Hostname": n, "gpu": "0", "UUID": f"GPU-{n}-0"}, 85.0)
            for n, (a, b) in windows.items()
            if a <= i < b
        ]
        results = {r.name: empty for r in ruleset.rules}
        results["GpuTooHot"] = QueryResult(samples=hot)
        replay.tick(START + timedelta(seconds=i * args.step), results, fleet=nodes)
    elapsed = time.perf_counter() - began
    end = START + timedelta(seconds=(ticks - 1) * args.step)
    report = summarize(
        replay.result(), rules=[r.name for r in ruleset.rules], start=START, end=end, step_seconds=args.step
    )
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    hot_rule = report.rule("GpuTooHot")
    window = f"{args.days:g} days at {args.step:g} s"
    print(f"nodes {args.nodes}, ticks {ticks} ({window}), faulty nodes {len(faulty)}")
    print(f"replay: {elapsed:.1f} s, {ticks / elapsed:.0f} ticks/s, {elapsed / ticks * 1000:.2f} ms per tick")
    if hot_rule is not None:
        out, held = hot_rule.nodes_out, hot_rule.held_budget
        print(f"GpuTooHot: fired {hot_rule.fired}, nodes out {out}, held by budget {held}")
    print(f"peak RSS {rss_mb:.0f} MB (target < 300 MB)")
    return 0 if rss_mb < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
