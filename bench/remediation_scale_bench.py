"""Remediation at fleet scale: one controller pass over 8,000 and 10,240 nodes, SQLite and PostgreSQL.

Cases (each on a fresh migrated database and a fresh Kubernetes API emulator on loopback holding
the fleet's nodes; the controller's ``remediate`` pass exactly as the scheduler calls it, with the
real Kubernetes adapter, the fleet map and safety budgets wide enough not to hold anyone back):

* **quiet** at ``--nodes`` (8,000): every node healthy and already known, no findings;
* **5 % newly firing** at ``--nodes``: 400 healthy nodes get a firing finding of a rule that
  quarantines (cordon, taint, condition, Events) in one pass;
* **quiet** at ``--large`` (10,240): SQL statements of the pass (against the same count at a tenth of
  the fleet: must be constant) and this process's peak RSS.

Prints wall times, SQL statements (SQLAlchemy ``before_cursor_execute``; ``BEGIN``/``COMMIT`` not
included) and API requests. The emulator runs in a child process, as kube-apiserver is another
process than the controller in a cluster: this process's CPU time and peak RSS are the
controller's own (and SQLite's, which runs inside it). Run from the repository root::

    python bench/remediation_scale_bench.py                       # SQLite and PostgreSQL (~3 min)
    python bench/remediation_scale_bench.py --backends sqlite --nodes 2000 --large 2048

Wall times on a shared machine measure the load as much as healer; the CPU seconds of the pass
(this process's, threads included; the emulator's and PostgreSQL's are not) are printed beside
them. Exit status 0 when the targets hold:
quiet pass < 0.3 s and 5 % pass < 5 s (wall) on every backend, the large quiet pass's statements
equal the small one's, peak RSS < 400 MB.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, Configuration
from sqlalchemy import event

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from healer.actions.kubernetes import KubernetesNodeActions
from healer.config import KubernetesSettings, SafetySettings, Settings
from healer.controller import remediate
from healer.model.findings import TickFindings
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.k8s_emulator import KubernetesEmulator, node
from tests.services import postgres_server

sys.path.insert(0, str(Path(__file__).resolve().parent))
from controller_calls_bench import T0, hot  # the same finding, the same time

RULES = RuleSet(
    groups=(
        RuleGroup(
            name="gpu",
            rules=[
                Rule(
                    name="GpuTooHot",
                    expr="max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78",
                    actions=["quarantine"],
                )
            ],
        ),
    )
)


def peak_rss_mib() -> float:
    """Peak resident set size of this process, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def _serve(conn: Connection, nodes: int) -> None:
    """The child process: an emulator holding ``nodes`` nodes; answers "requests" (how many it
    received so far) and "stop" on ``conn``."""
    emu = KubernetesEmulator()
    emu.load(node(name(i)) for i in range(nodes))
    emu.start()
    conn.send(emu.host)
    while (message := conn.recv()) != "stop":
        assert message == "requests"
        conn.send(len(emu.requests))
    emu.stop()
    conn.send("stopped")


class Emulator:
    """The Kubernetes API emulator in a child process (kube-apiserver is not the controller's
    process either), holding ``nodes`` nodes."""

    def __init__(self, nodes: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, nodes), daemon=True)
        self._process.start()
        self.host: str = self._conn.recv()

    @property
    def requests(self) -> int:
        """Requests the emulator received so far."""
        self._conn.send("requests")
        count: int = self._conn.recv()
        return count

    def stop(self) -> None:
        self._conn.send("stop")
        self._conn.recv()
        self._process.join(timeout=10)


class Fleet:
    """A migrated database at ``url``, an emulator holding ``nodes`` nodes, the real adapter."""

    def __init__(self, url: str, nodes: int) -> None:
        migrate.upgrade(url)
        self.engine = make_engine(url)
        self.sessions = make_sessionmaker(self.engine)
        self.emu = Emulator(nodes)
        self.api = ApiClient(Configuration(host=self.emu.host))
        k8s = KubernetesSettings(domain="healer.dev", request_timeout_seconds=30)
        self.settings = Settings(
            kubernetes=k8s,
            safety=SafetySettings(
                dry_run=False,
                max_unhealthy=nodes,
                max_unhealthy_percent=100,
                breaker_nodes=nodes,
                breaker_percent=100,
            ),
        )
        self.actions = KubernetesNodeActions(self.api, k8s, identity="bench", clock=lambda: T0)
        self.fleet = {name(i): "default" for i in range(nodes)}
        self.statements = 0
        event.listen(self.engine, "before_cursor_execute", self._count)

    def _count(self, *_args: Any) -> None:
        self.statements += 1

    def tick(self, at: datetime, firing: Sequence[str] = ()) -> tuple[float, int, int, float]:
        """One pass; returns (wall seconds, SQL statements, API requests, CPU seconds of this
        process: the controller and SQLite; the emulator's and PostgreSQL's processes not included)."""
        statements, requests = self.statements, self.emu.requests
        t0, cpu0 = time.perf_counter(), time.process_time()
        remediate(
            findings=TickFindings(at=at, firing={n: [hot(n)] for n in firing}),
            rules=RULES,
            actions=self.actions,
            session_factory=self.sessions,
            settings=self.settings,
            now=at,
            fleet=self.fleet,
        )
        return (
            time.perf_counter() - t0,
            self.statements - statements,
            self.emu.requests - requests,
            time.process_time() - cpu0,
        )

    def close(self) -> None:
        self.api.close()
        self.emu.stop()
        self.engine.dispose()


@contextmanager
def database_urls(backends: list[str], workdir: Path) -> Iterator[dict[str, Any]]:
    """backend -> a function making a fresh database URL."""
    makers: dict[str, Any] = {}
    counter = iter(range(1000))
    if "sqlite" in backends:
        makers["sqlite"] = lambda: f"sqlite:///{workdir / f'bench-{next(counter)}.db'}"
    if "postgresql" in backends:
        with postgres_server() as pg:
            makers["postgresql"] = lambda: pg.create_database(f"bench{next(counter)}")
            yield makers
            return
    yield makers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8000)
    parser.add_argument("--large", type=int, default=10240)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    args = parser.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory() as tmp, database_urls(args.backends, Path(tmp)) as urls:
        for backend, make_url in urls.items():
            fleet = Fleet(make_url(), args.nodes)
            try:
                fleet.tick(T0 - timedelta(minutes=2))  # first sight of the fleet: rows created
                fleet.tick(T0 - timedelta(minutes=1))  # warm
                quiet = fleet.tick(T0)
                newly = [name(i) for i in range(0, args.nodes, 20)]  # 5 %
                firing = fleet.tick(T0 + timedelta(seconds=30), newly)
            finally:
                fleet.close()
            print(
                f"{backend:10s} {args.nodes} nodes: quiet pass {quiet[0]:.3f} s (CPU {quiet[3]:.3f} s; "
                f"{quiet[1]} SQL, {quiet[2]} API); {len(newly)} newly firing: {firing[0]:.2f} s "
                f"(CPU {firing[3]:.2f} s; "
                f"{firing[1]} SQL = {firing[1] / len(newly):.1f}/node, "
                f"{firing[2]} API = {firing[2] / len(newly):.1f}/node)"
            )
            ok = ok and quiet[0] < 0.3 and firing[0] < 5

        backend, make_url = next(iter(urls.items()))
        counts: dict[int, tuple[float, int, int, float]] = {}
        for size in (args.large // 10, args.large):
            fleet = Fleet(make_url(), size)
            try:
                fleet.tick(T0 - timedelta(minutes=1))
                counts[size] = fleet.tick(T0)
            finally:
                fleet.close()
            print(
                f"{backend:10s} {size} nodes: quiet pass {counts[size][0]:.3f} s, "
                f"{counts[size][1]} SQL statements"
            )
        constant = len({c[1] for c in counts.values()}) == 1
        rss = peak_rss_mib()
        print(
            f"SQL statements constant in the fleet size: {constant}; "
            f"peak RSS {rss:.0f} MiB (the controller's process; the emulator runs in its own)"
        )
        ok = ok and constant and rss < 400
    print("targets:", "OK" if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
