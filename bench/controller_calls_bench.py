"""Count the controller's Kubernetes API calls and SQL statements per node step.

Scenarios (each on a fresh SQLite database and a fresh Kubernetes API emulator on loopback):

* **a** one node healthy → draining in one tick (a rule that quarantines, drains and tickets);
* **b** one drain step of that node (one evictable pod: evicted, drain done → awaiting_repair);
* **c** a quiet tick (no findings, every node healthy) at ``--nodes`` nodes (2,000 by default)
  and at a tenth of that, to show whether the statements grow with the fleet.

Kubernetes calls are the requests the emulator received (method + path); SQL statements are
SQLAlchemy ``before_cursor_execute`` events (every statement sent to the database, ``BEGIN`` and
``COMMIT`` excluded). Run from the repository root::

    python bench/controller_calls_bench.py            # ~10 s
    python bench/controller_calls_bench.py --nodes 500

Exit status 0 when the targets hold: at most 5 API calls for (a) and the same number of
statements for (c) at both fleet sizes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from healer.config import KubernetesSettings
from healer.model.findings import Finding
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.k8s_emulator import KubernetesEmulator, node, pod
from healer_dev.remediation_harness import T0, Counts, Harness, counting, hot, tick

NODE = "gpu-00"
RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[
                Rule(
                    name="GpuTooHot",
                    expr="max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78",
                    actions=["quarantine", {"drain": {"timeout": "10m"}}, {"ticket": {"provider": "acme"}}],
                )
            ],
        ),
    )
)


class World:
    """A database, an emulator with ``nodes`` nodes, the real adapter and settings."""

    def __init__(self, workdir: Path, nodes: int) -> None:
        url = f"sqlite:///{workdir / f'bench-{nodes}.db'}"
        migrate.upgrade(url)
        self.engine = make_engine(url)
        self.sessions = make_sessionmaker(self.engine)
        self.emu = KubernetesEmulator().start()
        self.emu.load(node(f"gpu-{i:02d}") for i in range(nodes))
        self.emu.add(pod("train-0", node_name=NODE))
        self.harness = Harness(
            self.emu,
            self.sessions,
            KubernetesSettings(domain="healer.dev", request_timeout_seconds=5),
            rules=RULES,
            identity="bench",
            max_unhealthy=10,
            max_unhealthy_percent=100,
            breaker_nodes=100,
            breaker_percent=100,
        )
        self.api = self.harness.api
        self.settings = self.harness.settings
        self.actions = self.harness.actions
        self.fleet = {f"gpu-{i:02d}": "default" for i in range(nodes)}

    def tick(self, at: datetime, *firing: Finding) -> Any:
        return self.harness.remediate(tick(at, *firing), fleet=self.fleet)

    def drains(self, at: datetime) -> Any:
        return self.harness.drains(at)

    def close(self) -> None:
        self.api.close()
        self.emu.stop()
        self.engine.dispose()


def report(label: str, counts: Counts, moved: dict[str, str]) -> None:
    print(f"{label}")
    print(f"  Kubernetes API calls: {len(counts.api):5d}  ({counts.api_by_method()})")
    print(f"  SQL statements:       {len(counts.sql):5d}  ({counts.sql_by_verb()})")
    if moved:
        print(f"  nodes moved: {moved}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000, help="fleet size for the quiet tick (c)")
    parser.add_argument("--verbose", action="store_true", help="print every call")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)

        world = World(workdir, 3)
        try:
            world.tick(T0 - timedelta(minutes=1))  # the fleet is known, every node healthy
            with counting(world.engine, world.emu) as a:
                result = world.tick(T0, hot(NODE))
            report("(a) one node healthy -> draining (one tick)", a, result.states())
            with counting(world.engine, world.emu) as b:
                result = world.drains(T0 + timedelta(seconds=10))
            report("(b) one drain step (one pod evicted, drain done)", b, result.states())
            if args.verbose:
                for what, counts in (("a", a), ("b", b)):
                    print(f"-- {what}:")
                    print("\n".join(f"   {m} {p}" for m, p in counts.api))
                    print("\n".join(f"   {s.splitlines()[0][:110]}" for s in counts.sql))
        finally:
            world.close()

        quiet: dict[int, Counts] = {}
        for size in sorted({max(1, args.nodes // 10), args.nodes}):
            world = World(workdir, size)
            try:
                world.tick(T0 - timedelta(minutes=1))  # first sight of the fleet: rows created
                with counting(world.engine, world.emu) as c:
                    world.tick(T0)
                quiet[size] = c
                report(f"(c) quiet tick at {size} nodes", c, {})
            finally:
                world.close()

    sizes = sorted(quiet)
    constant = len({len(quiet[s].sql) for s in sizes}) == 1
    ok = len(a.api) <= 5 and constant
    verdict = "OK" if ok else "NOT MET"
    print(f"targets: (a) <= 5 API calls: {len(a.api)}; (c) constant in nodes: {constant} -> {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
