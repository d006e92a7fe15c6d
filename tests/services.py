"""Real services for tests: a throwaway PostgreSQL server and Prometheus servers.

Started by fixtures in ``tests/conftest.py``; nothing here is mocked. Binaries come from Debian's
packages (``postgresql-15``, ``prometheus``), which ``.ci/run`` installs.
"""

from __future__ import annotations

import contextlib
import glob
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

from healer_dev.prometheus import (
    PrometheusServer,
    ScrapeTarget,
    free_port,
    prometheus_server,
    wait_until,
)

__all__ = [
    "PostgresServer",
    "PrometheusServer",
    "ScrapeTarget",
    "free_port",
    "postgres_server",
    "prometheus_server",
    "simulator_targets",
    "text_exporter",
    "wait_until",
]


# --- PostgreSQL -------------------------------------------------------------------------------


def _pg_bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise RuntimeError(
            "PostgreSQL server binaries not found under /usr/lib/postgresql (install postgresql)"
        )
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

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres", autocommit=True
        ) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
    opts = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
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
