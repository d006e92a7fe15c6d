"""`healer run` refuses to act when a rule's repair tickets could never be delivered.

A real `healer run` subprocess on SQLite. The refusal comes before any cluster or Prometheus is
contacted; the runs that do start talk to the Kubernetes API emulator over loopback and to a
Prometheus address where nothing listens (no data is not a fault: the controller still starts).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from healer_dev.k8s_emulator import KubernetesEmulator, namespace
from tests.services import free_port, wait_until

RULES = """
groups:
  - name: thermal
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 1m
        actions:
          - quarantine
          - ticket: {provider: default}
"""


@pytest.fixture
def cluster() -> Iterator[KubernetesEmulator]:
    with KubernetesEmulator() as emu:
        emu.load([namespace("healer-system")])
        yield emu


def _config(tmp_path: Path, cluster: KubernetesEmulator, safety: dict[str, Any]) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "thermal.yaml").write_text(RULES, encoding="utf-8")
    config = tmp_path / "healer.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "rules_paths": [str(rules)],
                "database": {"url": f"sqlite:///{tmp_path / 'healer.db'}"},
                "prometheus": {"url": f"http://127.0.0.1:{free_port()}"},
                "kubernetes": {"kubeconfig": str(cluster.write_kubeconfig(tmp_path / "kubeconfig"))},
                "api": {"port": free_port()},
                "safety": safety,
            }
        ),
        encoding="utf-8",
    )
    return config


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}


def test_acting_with_an_unconfigured_provider_does_not_start(
    tmp_path: Path, cluster: KubernetesEmulator
) -> None:
    config = _config(tmp_path, cluster, {"dry_run": False})
    result = subprocess.run(
        [sys.executable, "-m", "healer", "--config", str(config), "run", "--upgrade-db", "--text-logs"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_environment(),
        check=False,
    )
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: rule GpuTooHot opens tickets with provider 'default', which tickets.providers does not "
        "configure: healer would take nodes out of service and never ask for their repair; configure "
        "the provider, or set safety.dry_run: true, or accept it with safety.allow_missing_providers: true"
    ]
    assert "Traceback" not in result.stderr
    # Refused before touching the cluster: no Lease was taken.
    with httpx.Client(base_url=cluster.host) as client:
        leases = client.get("/apis/coordination.k8s.io/v1/namespaces/healer-system/leases").json()
    assert leases["items"] == []


@pytest.mark.parametrize(
    "safety",
    [{"dry_run": False, "allow_missing_providers": True}, {"dry_run": True}],
    ids=["acting-with-override", "dry-run"],
)
def test_override_or_dry_run_starts_and_says_why_tickets_stay(
    tmp_path: Path, cluster: KubernetesEmulator, safety: dict[str, Any]
) -> None:
    config = _config(tmp_path, cluster, safety)
    port = yaml.safe_load(config.read_text(encoding="utf-8"))["api"]["port"]
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "healer", "--config", str(config), "run", "--upgrade-db", "--text-logs"],
            stdout=out,
            stderr=out,
            env=_environment(),
        )
    try:
        # Generous: on a loaded 2-core CI machine start-up (migration, Lease, scheduler) is slow.
        wait_until(
            lambda: process.poll() is not None or "controller started" in log.read_text(encoding="utf-8"),
            timeout=180,
            what="healer run to start its controller",
        )
        assert process.poll() is None, log.read_text(encoding="utf-8")
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200,
            timeout=60,
            what="healer run to serve /healthz",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    text = log.read_text(encoding="utf-8")
    assert (
        "rule GpuTooHot opens tickets with provider 'default', which tickets.providers does not configure: "
        "its tickets will be recorded but never delivered"
    ) in text
