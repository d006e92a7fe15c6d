"""A real Alertmanager process delivering to healer's webhook receiver, for the tests.

Uses the ``prometheus-alertmanager`` binary on PATH (Debian package ``prometheus-alertmanager``).
It listens on loopback with clustering off (``--cluster.listen-address=`` empty: no gossip port),
keeps its silences and notification log in its own directory, and sends every alert group to one
webhook (:func:`receiver_config`, the configuration docs/operations.md shows), which
:meth:`AlertmanagerServer.deliver_to` changes while it runs (``POST /-/reload``).

Alerts reach it from Prometheus (``alerting: alertmanagers:``, see
:func:`healer_dev.prometheus.prometheus_server`) or from :meth:`AlertmanagerServer.post_alerts`
(its API v2, ``POST /api/v2/alerts``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from healer.sources.local_server import find_binary, local_server
from healer_dev.prometheus import wait_until

__all__ = ["AlertmanagerServer", "alertmanager_server", "receiver_config"]

#: Nothing listens there: the configuration Alertmanager starts with, before a test names healer.
NOWHERE = "http://127.0.0.1:9/"


def receiver_config(url: str, token_file: Path | None, *, group_interval: str = "1s") -> dict[str, Any]:
    """An Alertmanager configuration sending every alert to healer's receiver at ``url`` with the
    bearer token in ``token_file``: each alert its own group (``group_by: ['...']``), sent at once
    (``group_wait: 0s``), resolutions too."""
    webhook: dict[str, Any] = {"url": url, "send_resolved": True, "max_alerts": 50}
    if token_file is not None:
        webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}}
    return {
        "route": {
            "receiver": "healer",
            "group_by": ["..."],
            "group_wait": "0s",
            "group_interval": group_interval,
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "healer", "webhook_configs": [webhook]}],
    }


@dataclass
class AlertmanagerServer:
    """A real Alertmanager; ``url`` serves its API v2, ``address`` is host:port for Prometheus."""

    url: str
    process: subprocess.Popen[bytes]
    config_file: Path

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    def deliver_to(self, url: str, token_file: Path | None) -> None:
        """Send alerts to ``url`` with the token in ``token_file`` from now on; returns once
        Alertmanager runs that configuration."""
        text = yaml.safe_dump(receiver_config(url, token_file))
        staged = self.config_file.with_suffix(".tmp")
        staged.write_text(text)
        staged.replace(self.config_file)
        httpx.post(f"{self.url}/-/reload", timeout=10).raise_for_status()

        def running() -> bool:
            status = httpx.get(f"{self.url}/api/v2/status", timeout=10).json()
            return url in str(status["config"]["original"])

        wait_until(running, timeout=30, what="Alertmanager to load the new receiver")

    def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """Post alerts (``{"labels": {...}, "annotations": {...}, "startsAt": ...}``) as Prometheus
        does (``POST /api/v2/alerts``)."""
        httpx.post(f"{self.url}/api/v2/alerts", json=list(alerts), timeout=10).raise_for_status()


@contextlib.contextmanager
def alertmanager_server(
    *, workdir: Path | None = None, port: int | None = None, ready_timeout: float = 30.0
) -> Iterator[AlertmanagerServer]:
    """Start Alertmanager on loopback, clustering off, delivering nowhere until
    :meth:`AlertmanagerServer.deliver_to`; stop it on exit. ``workdir`` keeps its configuration,
    data and log (kept on exit); default a temporary directory removed on exit.

    Raises:
        BinaryNotFound: ``prometheus-alertmanager`` is not installed.
        SourceUnavailable: it exited or was not ready within ``ready_timeout`` seconds.
    """
    keep = workdir is not None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="healer-alertmanager-"))
    workdir.mkdir(parents=True, exist_ok=True)
    binary = find_binary("prometheus-alertmanager", package="prometheus-alertmanager")
    config_file = workdir / "alertmanager.yml"
    config_file.write_text(yaml.safe_dump(receiver_config(NOWHERE, None)))
    try:
        with local_server(
            lambda port: [
                binary,
                f"--config.file={config_file}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            log=workdir / "alertmanager.log",
            ready_path="/-/ready",
            name="alertmanager",
            ready_timeout=ready_timeout,
            port=port,
        ) as local:
            yield AlertmanagerServer(url=local.url, process=local.process, config_file=config_file)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
