"""Drain API economy: a 110-pod node under a ``maxUnavailable: 1`` PodDisruptionBudget.

::

    python bench/drain_bench.py                       # ~2 minutes
    python bench/drain_bench.py --pods 30 --readiness 0.05

Runs :func:`healer_dev.drain_scenario.run_drain` (the Kubernetes API emulator on loopback, the
official client, one ``drain_step`` per drain job) for a few replacement readiness times and two
budget waits (the default 5 s per step, and a whole drain in one step), and prints the API calls
against the minimum (one list, one accepted eviction per pod, the final list), the evictions by
HTTP code, the steps and the wall time against the replacements' total readiness. Exit status 0
when every run stays within 1.5x the minimum and no eviction is answered 429.
"""

from __future__ import annotations

import argparse
import sys

from healer_dev.drain_scenario import run_drain


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--readiness", type=float, action="append", help="seconds (repeatable)")
    parser.add_argument("--job-interval", type=float, default=10.0, help="the drain job's interval, s")
    args = parser.parse_args()
    ok = True
    print(
        f"{'readiness s':>11} {'wait s':>6} {'calls':>5} {'min':>4} {'ratio':>5} {'429':>4} {'steps':>5} "
        f"{'wall s':>7} {'readiness total s':>17}  calls by kind"
    )
    for readiness in args.readiness or [0.05, 0.2]:
        for wait in (5.0, 600.0):
            run = run_drain(
                pods=args.pods,
                readiness_seconds=readiness,
                job_interval_seconds=args.job_interval,
                budget_wait_seconds=wait,
            )
            refused = run.evictions.get(429, 0)
            ok &= run.ratio <= 1.5 and refused == 0
            print(
                f"{readiness:>11} {wait:>6.0f} {run.requests:>5} {run.minimum:>4} {run.ratio:>5.2f} "
                f"{refused:>4} {run.steps:>5} {run.wall_seconds:>7.1f} {readiness * run.pods:>17.1f}  "
                f"{dict(sorted(run.by_kind.items()))}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
