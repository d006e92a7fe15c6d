"""A real Prometheus server process, for the demo, the benchmarks and the tests.

Uses the ``prometheus`` binary on PATH (Debian package ``prometheus``).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.1, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; return it. Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
        except Exception as exc:  # the service may not be up yet
            last_exc = exc
        else:
            if result:
                return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}") from last_exc


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Terminate ``process``; kill it when it has not exited after ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- Prometheus -------------------------------------------------------------------------------


@dataclass
class ScrapeTarget:
    """One scrape target: ``address`` is host:port; ``labels`` are added target labels."""

    address: str
    metrics_path: str = "/metrics"
    labels: dict[str, str] = field(default_factory=dict)
    job: str = "healer-test"


@dataclass
class PrometheusServer:
    """A real Prometheus process; ``url`` is its base URL."""

    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; raises on any non-success answer."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        return list(body["data"]["result"])

    def wait_for_targets_up(self, count: int = 1, timeout: float = 30.0) -> None:
        """Wait until at least ``count`` targets have been scraped successfully."""

        def up() -> bool:
            return len([s for s in self.query("up == 1")]) >= count

        wait_until(up, timeout=timeout, what=f"{count} targets up in {self.url}")

    def wait_for_samples(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until ``expr`` returns at least one series; return them."""
        return list(wait_until(lambda: self.query(expr), timeout=timeout, what=f"series for {expr}"))


def _prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if not found:
        raise RuntimeError("prometheus not found on PATH (Debian package 'prometheus'; .ci/run installs it)")
    return found


@contextlib.contextmanager
def prometheus_server(
    targets: Sequence[ScrapeTarget],
    *,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    rule_files: Sequence[Path] = (),
    file_sd: Sequence[Path] = (),
    extra_args: Sequence[str] = (),
    workdir: Path | None = None,
    port: int | None = None,
) -> Iterator[PrometheusServer]:
    """Start Prometheus scraping ``targets`` with a short interval; stop it on exit.

    ``rule_files`` are loaded as Prometheus recording/alerting rule files (used by the benchmark to
    compare Prometheus's own evaluation with healer's). ``file_sd`` are ``file_sd_configs`` JSON
    files (e.g. the fleet simulator's), scraped as one job ``fleet``. ``workdir`` keeps the config,
    data and log there (kept on exit); default a temporary directory removed on exit.
    """
    keep = workdir is not None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="healer-prom-"))
    workdir.mkdir(parents=True, exist_ok=True)
    jobs: dict[tuple[str, str], list[ScrapeTarget]] = {}
    for t in targets:
        jobs.setdefault((t.job, t.metrics_path), []).append(t)
    scrape_configs = [
        {
            "job_name": f"{job}-{i}",
            "metrics_path": path,
            "scrape_interval": scrape_interval,
            "static_configs": [{"targets": [t.address], "labels": {"job": job, **t.labels}} for t in ts],
        }
        for i, ((job, path), ts) in enumerate(jobs.items())
    ]
    if file_sd:
        scrape_configs.append(
            {
                "job_name": "fleet",
                "scrape_interval": scrape_interval,
                "file_sd_configs": [
                    {"files": [str(p.resolve()) for p in file_sd], "refresh_interval": "10s"}
                ],
            }
        )
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "scrape_configs": scrape_configs,
        "rule_files": [str(p.resolve()) for p in rule_files],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = port or free_port()
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            _prometheus_binary(),
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
            *extra_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = PrometheusServer(url=f"http://127.0.0.1:{port}", process=process, workdir=workdir)
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError((workdir / "prometheus.log").read_text())
            return httpx.get(f"{server.url}/-/ready", timeout=2).status_code == 200

        wait_until(ready, timeout=30, what="prometheus ready")
        yield server
    finally:
        stop_process(process)
        log.close()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
