"""A real single-node VictoriaMetrics process scraping like Prometheus, for the tests and benchmarks.

Uses the ``victoria-metrics`` binary on PATH (Debian package ``victoria-metrics``). It scrapes the
same ``scrape_configs`` as :func:`healer_dev.prometheus.prometheus_server` (``-promscrape.config``)
and answers the Prometheus query API (``/api/v1/query``) that healer's source speaks.

Flags that matter to healer:

* ``-search.latencyOffset=0s``: by default (30 s) VictoriaMetrics answers a query for "now" as of
  30 s ago, so healer would see every fault 30 s late. A production VictoriaMetrics behind healer
  needs the same flag (docs/operations.md, "VictoriaMetrics, Thanos, Mimir").
* ``-promscrape.fileSDCheckInterval=1s``: file_sd changes (a test's targets) are picked up within a
  second instead of 5 minutes.
* ``-retentionPeriod=1d``: the smallest retention it accepts; data lives in a temporary directory.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from healer.sources.local_server import find_binary, local_server
from healer_dev.prometheus import PrometheusServer, ScrapeTarget, scrape_configs

__all__ = ["VictoriaMetricsServer", "victoria_metrics_server"]


class VictoriaMetricsServer(PrometheusServer):
    """A real VictoriaMetrics process; ``url`` serves the Prometheus query API."""


@contextlib.contextmanager
def victoria_metrics_server(
    targets: Sequence[ScrapeTarget] = (),
    *,
    scrape_interval: str = "1s",
    file_sd: Sequence[Path] = (),
    extra_args: Sequence[str] = (),
    workdir: Path | None = None,
    port: int | None = None,
    ready_timeout: float = 30.0,
    keepalive: bool = True,
    metric_relabel_configs: Sequence[Mapping[str, Any]] = (),
) -> Iterator[VictoriaMetricsServer]:
    """Start VictoriaMetrics scraping ``targets`` and the ``file_sd`` JSON files (job ``fleet``,
    re-read every second); stop it on exit.

    ``workdir`` keeps the config, data and log there (kept on exit); default a temporary directory
    removed on exit. ``extra_args`` are appended to the command line (e.g. ``-memory.allowedPercent``).
    ``keepalive=False`` opens a connection per scrape (VictoriaMetrics' ``disable_keepalive``): the
    fleet simulator answers each open connection in a thread of its own, and 10,000 idle
    keep-alive connections are 10,000 threads fighting for one interpreter lock.
    ``metric_relabel_configs`` is added to every scrape job (Prometheus's format, which
    VictoriaMetrics reads too), e.g. the keep-list of ``healer rules scrape-keep``.
    """
    keep = workdir is not None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="healer-vm-"))
    workdir.mkdir(parents=True, exist_ok=True)
    configs = scrape_configs(
        targets,
        scrape_interval=scrape_interval,
        file_sd=file_sd,
        metric_relabel_configs=metric_relabel_configs,
    )
    if not keepalive:
        for c in configs:
            c["disable_keepalive"] = True
    config = {"global": {"scrape_interval": scrape_interval}, "scrape_configs": configs}
    (workdir / "promscrape.yml").write_text(yaml.safe_dump(config))
    binary = find_binary("victoria-metrics", package="victoria-metrics")
    try:
        with local_server(
            lambda port: [
                binary,
                f"-httpListenAddr=127.0.0.1:{port}",
                f"-storageDataPath={workdir / 'data'}",
                "-retentionPeriod=1d",
                f"-promscrape.config={workdir / 'promscrape.yml'}",
                "-promscrape.fileSDCheckInterval=1s",
                "-search.latencyOffset=0s",
                "-loggerLevel=WARN",
                *extra_args,
            ],
            log=workdir / "victoria-metrics.log",
            ready_path="/-/ready",
            name="victoria-metrics",
            ready_timeout=ready_timeout,
            port=port,
        ) as local:
            yield VictoriaMetricsServer(url=local.url, process=local.process, workdir=workdir)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
