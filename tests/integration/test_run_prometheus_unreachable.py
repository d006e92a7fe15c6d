"""A Prometheus that cannot be queried is loud: a real `healer run` pointed at a closed port logs
one line with the reason, fails /readyz once the grace period has passed, and turns the fleet
page's header red with the reason; when Prometheus answers again, one line says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from healer_dev.k8s_emulator import KubernetesEmulator, namespace
from tests.services import free_port, wait_until

RULES = """
groups:
  - name: thermal
    interval: 1s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 1m
        actions:
          - quarantine
"""

GRACE_SECONDS = 4


@pytest.fixture
def cluster() -> Iterator[KubernetesEmulator]:
    with KubernetesEmulator() as emu:
        emu.load([namespace("healer-system")])
        yield emu


def test_a_closed_prometheus_port_fails_readiness_logs_once_and_turns_the_header_red(
    tmp_path: Path, cluster: KubernetesEmulator
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "thermal.yaml").write_text(RULES, encoding="utf-8")
    port = free_port()
    config = tmp_path / "healer.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "rules_paths": [str(rules)],
                "database": {"url": f"sqlite:///{tmp_path / 'healer.db'}"},
                "prometheus": {
                    "url": f"http://127.0.0.1:{free_port()}",  # nothing listens there
                    "unavailable_grace_seconds": GRACE_SECONDS,
                },
                "scheduler": {"default_interval_seconds": 1},
                "kubernetes": {"kubeconfig": str(cluster.write_kubeconfig(tmp_path / "kubeconfig"))},
                "api": {"port": port, "anonymous_role": "viewer"},
                "safety": {"dry_run": True},
            }
        ),
        encoding="utf-8",
    )
    log = tmp_path / "run.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "healer", "--config", str(config), "run", "--upgrade-db", "--text-logs"],
            stdout=out,
            stderr=out,
            env=env,
        )
    base = f"http://127.0.0.1:{port}"

    def readyz() -> httpx.Response | None:
        try:
            return httpx.get(f"{base}/readyz", timeout=2)
        except httpx.TransportError:
            return None

    try:
        wait_until(
            lambda: process.poll() is not None or "prometheus cannot be queried" in log.read_text("utf-8"),
            timeout=180,
            what="healer run to log that Prometheus cannot be queried",
        )
        assert process.poll() is None, log.read_text("utf-8")
        first = readyz()
        wait_until(
            lambda: (r := readyz()) is not None and r.status_code == 503,
            timeout=60,
            what="/readyz to fail once the grace period has passed",
        )
        body = httpx.get(f"{base}/readyz", timeout=5).json()
        page = httpx.get(f"{base}/", timeout=10).text
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    text = log.read_text("utf-8")
    # Within the grace period the replica was still ready (a single bad tick is not an outage).
    assert first is None or first.status_code == 200 or "prometheus" not in first.text
    [reason] = [r for r in body["reasons"] if r.startswith("prometheus cannot be queried")]
    assert "Connection refused" in reason or "ConnectionRefused" in reason, reason
    assert f"(grace {GRACE_SECONDS}s)" in reason
    assert body["source"]["ok"] is False
    # One line per state change, not one per tick (ticks run every second).
    lines = [line for line in text.splitlines() if "prometheus cannot be queried" in line]
    assert len(lines) == 1, text
    assert "Connection refused" in lines[0] and "unready after 4s" in lines[0]
    # The header is red and says why.
    assert 'class="top alarm"' in page
    assert 'data-testid="source-alarm"' in page
    assert "Prometheus cannot be queried" in page
    assert "Connection refused" in page
    assert process.returncode == 0
