"""A real Prometheus server process, for the demo, the benchmarks and the tests.

Uses the ``prometheus`` binary on PATH (Debian package ``prometheus``, 2.42 on Debian 12) unless
given another (the tests' Prometheus 3, ``tests/prometheus3/build.sh``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from healer.sources.local_server import free_port, local_prometheus, stop_process

__all__ = [
    "PrometheusServer",
    "ScrapeTarget",
    "free_port",
    "prometheus3_bindir",
    "prometheus_server",
    "prometheus_version",
    "scrape_configs",
    "stop_process",
    "wait_until",
]


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


# --- Prometheus -------------------------------------------------------------------------------

#: Builds Prometheus 3's ``prometheus`` and ``promtool`` from the Go module and prints their
#: directory (``--dir``: only print it).
PROMETHEUS3_BUILD = Path(__file__).resolve().parents[1] / "tests" / "prometheus3" / "build.sh"


def prometheus3_bindir(*, build: bool = False) -> Path | None:
    """The directory holding ``prometheus`` and ``promtool`` 3.x as ``tests/prometheus3/build.sh``
    caches them; None when they are not built (or, with ``build``, when the build failed: its
    output went to stderr). ``build`` builds them first when missing (minutes cold, needs Go)."""
    if not PROMETHEUS3_BUILD.exists() or shutil.which("bash") is None:
        return None
    argv = ["bash", str(PROMETHEUS3_BUILD)] + ([] if build else ["--dir"])
    out = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False).stdout.strip()
    where = Path(out.splitlines()[-1]) if out else None
    if where is None or not all(os.access(where / b, os.X_OK) for b in ("prometheus", "promtool")):
        return None
    return where


def prometheus_version(binary: str) -> str:
    """The version ``binary --version`` reports (``prometheus, version 3.16.0 (branch: ...)`` ->
    ``3.16.0``; promtool's first line has the same shape). Raises RuntimeError when it says
    something else."""
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False, timeout=30)
    words = (done.stdout + done.stderr).split()
    if len(words) < 3 or words[1] != "version":
        raise RuntimeError(f"{binary} --version: {done.stdout}{done.stderr}")
    return words[2]


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


def scrape_configs(
    targets: Sequence[ScrapeTarget],
    *,
    scrape_interval: str,
    file_sd: Sequence[Path] = (),
    metric_relabel_configs: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The ``scrape_configs`` of a Prometheus config file scraping ``targets`` (one job per job name
    and metrics path) and the ``file_sd`` JSON files (one job ``fleet``). VictoriaMetrics reads the
    same section (``-promscrape.config``). ``metric_relabel_configs`` (e.g. the keep-list of
    ``healer rules scrape-keep``) is added to every job when given."""
    jobs: dict[tuple[str, str], list[ScrapeTarget]] = {}
    for t in targets:
        jobs.setdefault((t.job, t.metrics_path), []).append(t)
    configs: list[dict[str, Any]] = [
        {
            "job_name": f"{job}-{i}",
            "metrics_path": path,
            "scrape_interval": scrape_interval,
            "static_configs": [{"targets": [t.address], "labels": {"job": job, **t.labels}} for t in ts],
        }
        for i, ((job, path), ts) in enumerate(jobs.items())
    ]
    if file_sd:
        configs.append(
            {
                "job_name": "fleet",
                "scrape_interval": scrape_interval,
                "file_sd_configs": [{"files": [str(p.resolve()) for p in file_sd]}],
            }
        )
    if metric_relabel_configs:
        for c in configs:
            c["metric_relabel_configs"] = [dict(r) for r in metric_relabel_configs]
    return configs


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
    metric_relabel_configs: Sequence[Mapping[str, Any]] = (),
    alertmanagers: Sequence[str] = (),
    binary: str | None = None,
) -> Iterator[PrometheusServer]:
    """Start Prometheus scraping ``targets`` with a short interval; stop it on exit.

    ``rule_files`` are loaded as Prometheus recording/alerting rule files (used by the benchmark to
    compare Prometheus's own evaluation with healer's). ``file_sd`` are ``file_sd_configs`` JSON
    files (e.g. the fleet simulator's), scraped as one job ``fleet``. ``workdir`` keeps the config,
    data and log there (kept on exit); default a temporary directory removed on exit.
    ``metric_relabel_configs`` is added to every scrape job (:func:`scrape_configs`).
    ``alertmanagers`` (host:port each) receive the alerts of ``rule_files`` (API v2).
    ``binary`` is the ``prometheus`` to run (default the one on PATH).
    """
    keep = workdir is not None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="healer-prom-"))
    workdir.mkdir(parents=True, exist_ok=True)
    configs = scrape_configs(
        targets,
        scrape_interval=scrape_interval,
        file_sd=file_sd,
        metric_relabel_configs=metric_relabel_configs,
    )
    for c in configs:
        for sd in c.get("file_sd_configs", []):
            sd["refresh_interval"] = "10s"
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "scrape_configs": configs,
        "rule_files": [str(p.resolve()) for p in rule_files],
    }
    if alertmanagers:
        config["alerting"] = {
            "alertmanagers": [{"api_version": "v2", "static_configs": [{"targets": list(alertmanagers)}]}]
        }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    try:
        with local_prometheus(
            config=workdir / "prometheus.yml",
            data=workdir / "data",
            log=workdir / "prometheus.log",
            extra_args=["--web.enable-lifecycle", *extra_args],
            port=port,
            binary=binary,
        ) as local:
            yield PrometheusServer(url=local.url, process=local.process, workdir=workdir)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
