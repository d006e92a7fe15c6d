"""Dashboard and API latency on a large fleet, on SQLite and PostgreSQL.

Seeds 10,000 nodes (80,000 GPUs) and 1,000,000 transitions, plus incidents, findings, actions,
tickets and rule evaluations in proportion, then serves the real app with uvicorn and measures,
over HTTP, the fleet page, a node page (its busiest node), and the nodes API (first and a deep
cursor page). Prints p50/p95 per request against the 150 ms target.

Usage (one command; PostgreSQL is a throwaway server from ``tests.services``)::

    python bench/dashboard_bench.py                      # both backends, full size
    python bench/dashboard_bench.py --backends sqlite --nodes 2000 --transitions 100000

The node page's chart queries Prometheus; here Prometheus is a closed port, so the chart fails in
about a millisecond and the figure is the dashboard's own time (a real Prometheus adds its range
query time, bounded by a 3 s timeout).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from healer.config import load_settings
from healer.ruleset.schema import Rule, RuleGroup, RuleSet
from healer.store import migrate
from healer.store.models import Base
from healer.store.session import make_engine, make_sessionmaker
from healer.wiring import dashboard
from tests.services import free_port, postgres_server, wait_until

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TARGET_MS = 150.0
POOLS = ("h100-a", "h100-b", "a100", "gb200")
UNHEALTHY_STATES = (
    "suspect",
    "quarantined",
    "draining",
    "awaiting_repair",
    "validating",
    "blocked",
    "released",
)
RULES = tuple(f"Rule{i:02d}" for i in range(20))
BUSY_NODE = "gpu-node-00042"
CHUNK = 50_000


# --- fast seeding --------------------------------------------------------------------------


def _ts(value: datetime, dialect: str) -> Any:
    # SQLite stores naive UTC text in SQLAlchemy's format; PostgreSQL's COPY takes aware datetimes.
    if dialect == "sqlite":
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return value


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


class Loader:
    """Bulk loads through the raw DBAPI: ``executemany`` on SQLite, ``COPY`` on PostgreSQL."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name

    def load(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        # Columns added to the models later get their scalar defaults, so the bench keeps working.
        extra = [
            (c.name, c.default.arg)
            for c in Base.metadata.tables[table].columns
            if c.name not in columns and c.default is not None and c.default.is_scalar
        ]
        if extra:
            columns = [*columns, *(name for name, _ in extra)]
            tail = tuple(value for _, value in extra)
            rows = (tuple(row) + tail for row in rows)
        conn = self.engine.raw_connection()
        count = 0
        try:
            cur = conn.cursor()
            quoted = ", ".join(f'"{c}"' for c in columns)  # "group" and "index" are SQL keywords
            if self.dialect == "sqlite":
                sql = f"INSERT INTO {table} ({quoted}) VALUES ({', '.join('?' * len(columns))})"
                for chunk in _chunks(rows, CHUNK):
                    cur.executemany(sql, chunk)
                    count += len(chunk)
            else:
                with cur.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                        count += 1
            conn.commit()
        finally:
            conn.close()
        return count


def _chunks(rows: Iterable[Sequence[Any]], size: int) -> Iterator[list[Sequence[Any]]]:
    chunk: list[Sequence[Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def seed(engine: Any, *, nodes: int, transitions: int, rng: random.Random) -> dict[str, int]:
    """Fill an empty, migrated database; returns row counts per table."""
    loader = Loader(engine)
    d = loader.dialect
    counts: dict[str, int] = {}
    names = [f"gpu-node-{i:05d}" for i in range(nodes)]
    unhealthy = set(rng.sample(range(nodes), k=nodes // 10))
    unhealthy.add(42)
    states = {i: rng.choice(UNHEALTHY_STATES) if i in unhealthy else "healthy" for i in range(nodes)}
    since = {i: NOW - timedelta(seconds=rng.randint(60, 30 * 86400)) for i in range(nodes)}
    old = NOW - timedelta(days=120)
    counts["nodes"] = loader.load(
        "nodes",
        ("id", "name", "pool", "state", "state_since", "opted_out", "created_at", "updated_at"),
        (
            (
                i + 1,
                names[i],
                POOLS[i % len(POOLS)],
                states[i],
                _ts(since[i], d),
                False,
                _ts(old, d),
                _ts(NOW, d),
            )
            for i in range(nodes)
        ),
    )
    counts["gpus"] = loader.load(
        "gpus",
        ("uuid", "node_id", "index", "pci_bus_id", "model_name", "first_seen", "last_seen"),
        (
            (
                f"GPU-{i:05d}-{g}",
                i + 1,
                g,
                f"00000000:{0x18 + g:02X}:00.0",
                "NVIDIA H100 80GB HBM3",
                _ts(old, d),
                _ts(NOW, d),
            )
            for i in range(nodes)
            for g in range(8)
        ),
    )
    # An open incident per unhealthy node, and closed ones in the past for a third of the fleet.
    incident_rows = []
    open_incident: dict[int, int] = {}
    next_id = 1
    for i in sorted(unhealthy):
        incident_rows.append(
            (next_id, i + 1, _ts(since[i] - timedelta(minutes=10), d), None, "GPU fault", None, False)
        )
        open_incident[i] = next_id
        next_id += 1
    for i in range(0, nodes, 3):
        opened = NOW - timedelta(days=rng.randint(31, 90))
        incident_rows.append(
            (next_id, i + 1, _ts(opened, d), _ts(opened + timedelta(hours=6), d), "old", "recovered", False)
        )
        next_id += 1
    counts["incidents"] = loader.load(
        "incidents",
        ("id", "node_id", "opened_at", "closed_at", "summary", "close_reason", "escalated"),
        incident_rows,
    )

    def transition_rows() -> Iterator[tuple[Any, ...]]:
        busy = min(2_000, transitions // 10)
        for n in range(transitions):
            i = 42 if n < busy else rng.randrange(nodes)
            at = NOW - timedelta(seconds=rng.randint(60, 90 * 86400))
            yield (
                i + 1,
                open_incident.get(i),
                "healthy",
                "suspect",
                "healer",
                f"{rng.choice(RULES)} pending",
                _json({"rule": rng.choice(RULES), "value": 80.0 + rng.random() * 10, "labels": {"gpu": "3"}}),
                _ts(at, d),
            )

    counts["transitions"] = loader.load(
        "transitions",
        ("node_id", "incident_id", "from_state", "to_state", "actor", "reason", "evidence", "at"),
        transition_rows(),
    )

    def finding_rows() -> Iterator[tuple[Any, ...]]:
        for i in sorted(unhealthy):
            for rule in rng.sample(RULES, k=rng.randint(1, 2)):
                gpu = str(rng.randrange(8))
                yield (
                    rule,
                    f"{names[i]}/{gpu}",
                    names[i],
                    gpu,
                    "firing",
                    "critical",
                    85.0,
                    "degrees C",
                    _json({"gpu": gpu, "Hostname": names[i]}),
                    "",
                    _ts(since[i], d),
                    _ts(since[i], d),
                    None,
                    _ts(NOW, d),
                    open_incident.get(i),
                )
        for _ in range(nodes * 5):  # resolved history
            i = rng.randrange(nodes)
            at = NOW - timedelta(days=rng.randint(2, 90))
            yield (
                rng.choice(RULES),
                f"{names[i]}/0",
                names[i],
                "0",
                "resolved",
                "critical",
                70.0,
                None,
                _json({"gpu": "0"}),
                "",
                _ts(at, d),
                _ts(at, d),
                _ts(at + timedelta(hours=1), d),
                _ts(at, d),
                None,
            )

    counts["findings"] = loader.load(
        "findings",
        (
            "rule",
            "series_key",
            "node_name",
            "gpu",
            "state",
            "severity",
            "value",
            "unit",
            "labels",
            "summary",
            "active_since",
            "fired_at",
            "resolved_at",
            "last_seen_at",
            "incident_id",
        ),
        finding_rows(),
    )

    def action_rows() -> Iterator[tuple[Any, ...]]:
        for _ in range(transitions // 5):
            i = rng.randrange(nodes)
            at = NOW - timedelta(seconds=rng.randint(60, 90 * 86400))
            status = rng.choice(("succeeded", "dry_run", "refused", "failed"))
            yield (
                i + 1,
                None,
                rng.choice(("cordon", "taint", "drain", "ticket")),
                names[i],
                status,
                "healer",
                1,
                "budget" if status == "refused" else None,
                None,
                _ts(at, d),
                _ts(at, d),
            )

    counts["actions"] = loader.load(
        "actions",
        (
            "node_id",
            "incident_id",
            "kind",
            "target",
            "status",
            "actor",
            "attempts",
            "error",
            "detail",
            "created_at",
            "updated_at",
        ),
        action_rows(),
    )
    ticket_rows = []
    for t, i in enumerate(sorted(unhealthy)):
        created = since[i]
        ticket_rows.append(
            (
                t + 1,
                open_incident[i],
                i + 1,
                "default",
                f"k-{t}",
                rng.choice(("pending", "sent", "acknowledged")),
                None,
                False,
                None,
                None,
                _ts(created, d),
                _ts(NOW, d),
                _ts(created, d),
                None,
                None,
                None,
            )
        )
    counts["tickets"] = loader.load(
        "tickets",
        (
            "id",
            "incident_id",
            "node_id",
            "provider",
            "idempotency_key",
            "status",
            "external_id",
            "escalated",
            "reason",
            "last_error",
            "created_at",
            "updated_at",
            "sent_at",
            "acknowledged_at",
            "resolved_at",
            "closed_by",
        ),
        ticket_rows,
    )
    counts["outbox"] = loader.load(
        "outbox",
        (
            "ticket_id",
            "provider",
            "idempotency_key",
            "body",
            "status",
            "attempts",
            "next_attempt_at",
            "last_status_code",
            "last_error",
            "created_at",
            "delivered_at",
        ),
        (
            (r[0], "default", r[4], "{}", "pending", 1, _ts(NOW, d), 503, "unavailable", r[10], None)
            for r in ticket_rows
        ),
    )
    counts["rule_evaluations"] = loader.load(
        "rule_evaluations",
        (
            "rule",
            "group",
            "evaluated_at",
            "duration_seconds",
            "health",
            "error",
            "series",
            "firing",
            "warnings",
        ),
        (
            (rule, "gpu", _ts(NOW - timedelta(seconds=30 * k), d), 0.05, "ok", None, 80_000, 3, None)
            for k in range(2_000)
            for rule in RULES
        ),
    )
    last_tick = {"at": (NOW - timedelta(seconds=10)).isoformat(), "duration_seconds": 1.2, "leader": "bench"}
    loader.load(
        "switches",
        ("name", "value", "updated_at", "updated_by"),
        [("last_tick", _json(last_tick), _ts(NOW, d), "bench")],
    )
    conn = engine.raw_connection()
    try:
        conn.cursor().execute("ANALYZE")
        conn.commit()
    finally:
        conn.close()
    return counts


# --- measuring -----------------------------------------------------------------------------


@contextmanager
def serve(app: Any) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", access_log=False
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=15, interval=0.05, what="uvicorn")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def measure(
    client: httpx.Client, path: str | Callable[[], str], *, requests: int, warmup: int = 5
) -> list[float]:
    """Wall-clock milliseconds of ``requests`` sequential GETs (after ``warmup`` unmeasured ones)."""
    times = []
    for n in range(warmup + requests):
        url = path() if callable(path) else path
        start = time.perf_counter()
        r = client.get(url)
        elapsed = (time.perf_counter() - start) * 1000
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:300]}")
        if n >= warmup:
            times.append(elapsed)
    return times


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[94]


def run_backend(name: str, url: str, *, nodes: int, transitions: int, requests: int) -> list[tuple[str, ...]]:
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        started = time.perf_counter()
        counts = seed(engine, nodes=nodes, transitions=transitions, rng=random.Random(7))
        print(
            f"[{name}] seeded in {time.perf_counter() - started:.1f} s: "
            + ", ".join(f"{t} {c:,}" for t, c in counts.items()),
            flush=True,
        )
        settings = load_settings(
            database={"url": url},
            prometheus={"url": f"http://127.0.0.1:{free_port()}", "timeout_seconds": 1.0},
        )
        # As the controller does: the live rule set (20 rules) comes from a provider.
        ruleset = RuleSet(
            groups=(RuleGroup(name="gpu", rules=[Rule(name=r, expr="up == 0") for r in RULES]),)
        )
        app = dashboard(
            settings, make_sessionmaker(engine), clock=lambda: NOW, ruleset_provider=lambda: ruleset
        )
        rows = []
        with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
            cursor = None
            for _ in range(9):  # the 10th page, or the last one on a small fleet
                params: dict[str, Any] = {"unhealthy": True, "limit": 50}
                if cursor:
                    params["cursor"] = cursor
                following = client.get("/api/v1/nodes", params=params).json()["next_cursor"]
                if following is None:
                    break
                cursor = following
            deep = (
                f"/api/v1/nodes?unhealthy=true&limit=50&cursor={cursor}"
                if cursor
                else "/api/v1/nodes?limit=50"
            )
            cases: list[tuple[str, str | Callable[[], str]]] = [
                ("fleet page /", "/"),
                ("fleet page, filtered by rule", f"/?rule={RULES[3]}"),
                (f"node page /nodes/{BUSY_NODE}", f"/nodes/{BUSY_NODE}"),
                ("GET /api/v1/nodes?unhealthy=true", "/api/v1/nodes?unhealthy=true&limit=50"),
                ("GET /api/v1/nodes (10th page)", deep),
                (f"GET /api/v1/nodes/{BUSY_NODE}", f"/api/v1/nodes/{BUSY_NODE}"),
            ]
            for label, path in cases:
                times = measure(client, path, requests=requests)
                p = p95(times)
                rows.append(
                    (
                        name,
                        label,
                        f"{statistics.median(times):.1f}",
                        f"{p:.1f}",
                        "ok" if p < TARGET_MS else "SLOW",
                    )
                )
                print(f"[{name}] {label}: p95 {p:.1f} ms", flush=True)
        return rows
    finally:
        engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--transitions", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50, help="Measured requests per case.")
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args(argv)
    rows: list[tuple[str, ...]] = []
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    sizes = dict(nodes=args.nodes, transitions=args.transitions, requests=args.requests)
    with tempfile.TemporaryDirectory(prefix="healer-bench-") as tmp:
        if "sqlite" in backends:
            rows += run_backend("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}", **sizes)
        if "postgresql" in backends:
            with postgres_server() as pg:
                rows += run_backend("postgresql", pg.create_database("bench"), **sizes)
    header = ("backend", "request", "p50 ms", "p95 ms", f"< {TARGET_MS:.0f} ms")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print()
    print(f"{args.nodes:,} nodes, {args.transitions:,} transitions, {args.requests} requests per case")
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0 if all(r[-1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
