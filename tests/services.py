"""Real services for tests: a throwaway PostgreSQL server, Prometheus and VictoriaMetrics servers,
vmalert evaluating rules against that VictoriaMetrics, and Alertmanager delivering to healer.

Started by fixtures in ``tests/conftest.py``; nothing here is mocked. Binaries come from Debian's
packages (``postgresql-15``, ``prometheus``, ``victoria-metrics``, ``prometheus-alertmanager``),
which ``.ci/run`` installs; a
missing one raises :class:`~healer.errors.BinaryNotFound`, which skips the tests that need it
(``tests/service_skips.py``). Prometheus 3.x, built from its Go module, runs through the same
:func:`prometheus_server` (``binary=``; ``tests/prometheus_releases.py``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from healer.errors import BinaryNotFound
from healer_dev.alertmanager import AlertmanagerServer, alertmanager_server
from healer_dev.prometheus import (
    PrometheusServer,
    ScrapeTarget,
    free_port,
    prometheus_server,
    wait_until,
)
from healer_dev.victoria_metrics import VictoriaMetricsServer, victoria_metrics_server
from healer_dev.vmalert import VmalertServer, vmalert_server

__all__ = [
    "AlertmanagerServer",
    "PostgresServer",
    "PrometheusServer",
    "ScrapeTarget",
    "SharedVictoriaMetrics",
    "SharedVmalert",
    "VictoriaMetricsServer",
    "alertmanager_server",
    "free_port",
    "postgres_server",
    "prometheus_server",
    "shared_victoria_metrics",
    "shared_vmalert",
    "simulator_targets",
    "text_exporter",
    "victoria_metrics_server",
    "wait_until",
]


# --- PostgreSQL -------------------------------------------------------------------------------

PG_CTL = "/usr/lib/postgresql/*/bin/pg_ctl"


def _pg_bindir() -> Path:
    """Where Debian keeps the newest PostgreSQL server's binaries; raises BinaryNotFound."""
    found = sorted(glob.glob(PG_CTL))
    if not found:
        raise BinaryNotFound("pg_ctl", package="postgresql", where=PG_CTL)
    return Path(found[-1]).parent


@dataclass
class PostgresServer:
    """A PostgreSQL cluster in a temporary directory, trust auth on loopback."""

    port: int
    datadir: Path
    bindir: Path
    user: str

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """Create database ``name`` (a copy of database ``template`` when given); return its URL.

        Copying a migrated template is a file copy inside PostgreSQL (milliseconds), where running
        the migrations again costs about 0.4 s per database.
        """
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres", autocommit=True
        ) as c:
            c.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def restart(self) -> None:
        """Crash the server (``pg_ctl stop -m immediate``: connections cut, no clean shutdown) and
        start it again on the same port and data; returns once it accepts connections."""
        ctl = str(self.bindir / "pg_ctl")
        subprocess.run(
            _as_postgres([ctl, "-D", str(self.datadir), "-m", "immediate", "-w", "stop"]),
            check=True,
            capture_output=True,
        )
        opts = _server_options(self.port, self.datadir.parent)
        log = str(self.datadir.parent / "log")
        subprocess.run(
            _as_postgres([ctl, "-D", str(self.datadir), "-o", opts, "-l", log, "-w", "start"]),
            check=True,
            capture_output=True,
        )

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres", autocommit=True
        ) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _server_options(port: int, base: Path) -> str:
    """The throwaway server's options: loopback only, its socket in ``base``, no fsync (tests)."""
    return f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"


def _as_postgres(cmd: list[str]) -> list[str]:
    # initdb refuses to run as root; CI runs as root, a developer may not.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a throwaway PostgreSQL server; stop it and delete its files on exit."""
    bindir = _pg_bindir()
    base = Path(tempfile.mkdtemp(prefix="healer-pg-"))
    datadir = base / "data"
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    port = free_port()
    subprocess.run(
        _as_postgres([str(bindir / "initdb"), "-D", str(datadir), "-U", user, "-A", "trust", "-E", "UTF8"]),
        check=True,
        capture_output=True,
    )
    opts = _server_options(port, base)
    subprocess.run(
        _as_postgres(
            [str(bindir / "pg_ctl"), "-D", str(datadir), "-o", opts, "-l", str(base / "log"), "-w", "start"]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield PostgresServer(port=port, datadir=datadir, bindir=bindir, user=user)
    finally:
        subprocess.run(
            _as_postgres([str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "-w", "stop"]),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)


# --- VictoriaMetrics ----------------------------------------------------------------------------


@dataclass
class SharedVictoriaMetrics:
    """One VictoriaMetrics for the session (``victoria_metrics`` fixture): it scrapes whatever file_sd
    targets the test running now hands to :meth:`scrape`, every second (``scrape_interval`` of the
    file's groups is not read: the server's is).

    :meth:`scrape` first stops the previous targets and deletes every stored series, so a test sees
    only what its own targets exported (the rules that look an hour back would otherwise see the
    previous test's nodes fall silent).
    """

    server: VictoriaMetricsServer
    targets_file: Path

    @property
    def url(self) -> str:
        return self.server.url

    def scrape(self, file_sd: Path) -> None:
        """Scrape the targets of ``file_sd`` (a file_sd JSON file) instead of the previous ones, on
        an empty database; VictoriaMetrics re-reads the file within a second."""
        self.stop_scraping()
        self._delete_everything()
        self._write(json.loads(file_sd.read_text()))

    def stop_scraping(self) -> None:
        """Drop every target; returns once VictoriaMetrics scrapes none."""
        self._write([])

        def no_targets() -> bool:
            body = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()
            return not body["data"]["activeTargets"]

        wait_until(no_targets, timeout=30, what="VictoriaMetrics to stop scraping")

    def _delete_everything(self) -> None:
        every = {"match[]": '{__name__=~".+"}'}
        r = httpx.post(f"{self.url}/api/v1/admin/tsdb/delete_series", params=every, timeout=30)
        r.raise_for_status()
        wait_until(
            lambda: not self.server.query('count({__name__=~".+"})'),
            timeout=30,
            what="VictoriaMetrics to forget every series",
        )

    def _write(self, groups: list[object]) -> None:
        staged = self.targets_file.with_suffix(".tmp")
        staged.write_text(json.dumps(groups))
        staged.replace(self.targets_file)  # never a half-written file


@contextlib.contextmanager
def shared_victoria_metrics(workdir: Path) -> Iterator[SharedVictoriaMetrics]:
    """Start VictoriaMetrics with ``workdir/targets.json`` (empty) as its file_sd; stop it on exit."""
    targets_file = workdir / "targets.json"
    targets_file.write_text("[]")
    # A loaded test machine queues queries for longer than the default 30 s limit.
    extra = ["-search.maxQueryDuration=120s"]
    with victoria_metrics_server(file_sd=[targets_file], workdir=workdir / "vm", extra_args=extra) as server:
        yield SharedVictoriaMetrics(server=server, targets_file=targets_file)


@dataclass
class SharedVmalert:
    """One vmalert for the session (``vmalert`` fixture), evaluating against the session's
    VictoriaMetrics whatever rule file the test running now hands to :meth:`load`."""

    server: VmalertServer
    rules_file: Path

    @property
    def url(self) -> str:
        return self.server.url

    def load(self, rule_file: Mapping[str, Any]) -> None:
        """Evaluate ``rule_file`` (a Prometheus rule file's document) instead of the previous one;
        returns once vmalert lists exactly its groups."""
        self._write(rule_file)
        want = sorted(str(g["name"]) for g in rule_file.get("groups") or [])

        def loaded() -> bool:
            self.server.reload()
            body = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()
            return sorted(g["name"] for g in body["data"]["groups"] or []) == want  # none: null

        wait_until(loaded, timeout=30, interval=0.5, what="vmalert to load the rule file")

    def _write(self, rule_file: Mapping[str, Any]) -> None:
        staged = self.rules_file.with_suffix(".tmp")
        staged.write_text(json.dumps(rule_file))  # JSON is YAML
        staged.replace(self.rules_file)


@contextlib.contextmanager
def shared_vmalert(workdir: Path, datasource_url: str) -> Iterator[SharedVmalert]:
    """Start vmalert on ``workdir/rules.yml`` (no groups) against ``datasource_url``; stop it on exit."""
    rules_file = workdir / "rules.yml"
    rules_file.write_text('{"groups": []}')
    with vmalert_server([rules_file], datasource_url=datasource_url, workdir=workdir / "vmalert") as server:
        yield SharedVmalert(server=server, rules_file=rules_file)


# --- exporters --------------------------------------------------------------------------------


@contextlib.contextmanager
def text_exporter(render: Callable[[], str]) -> Iterator[str]:
    """Serve ``render()`` (a Prometheus text exposition, rendered per scrape) on any path of a
    loopback port; yield its host:port for a :class:`ScrapeTarget`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def simulator_targets(groups: Sequence[Mapping[str, Any]], address: str) -> list[ScrapeTarget]:
    """The fleet simulator's file_sd groups (``Fleet.targets(address)``) as scrape targets of
    ``address``: each group's metrics path, job and its other (non ``__``) labels."""
    return [
        ScrapeTarget(
            address=address,
            metrics_path=group["labels"]["__metrics_path__"],
            job=group["labels"]["job"],
            labels={k: v for k, v in group["labels"].items() if not k.startswith("__") and k != "job"},
        )
        for group in groups
    ]
