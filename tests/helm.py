"""The Helm chart as tests see it: the ``helm`` binary (built from its Go module) and rendering.

Used by the chart tests (tests/integration/test_deploy_manifests.py) and by the real control plane's
ServiceAccount fixture (tests/conftest.py), so healer runs there under exactly what the chart grants.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "chart" / "healer"
BUILD_HELM = REPO / "deploy" / "scripts" / "build-helm.sh"
NAMESPACE = "healer-system"
#: The chart refuses to render without an image repository (none is published for it).
IMAGE = ("--set", "image.repository=registry.example.com/healer")
MISSING = "helm is not built: run bash deploy/scripts/build-helm.sh (builds it from its Go module)"


def helm_binary() -> str | None:
    """``HEALER_HELM``, else the binary deploy/scripts/build-helm.sh built, else ``helm`` on PATH."""
    if os.environ.get("HEALER_HELM"):
        return os.environ["HEALER_HELM"]
    cached = subprocess.run(
        ["bash", str(BUILD_HELM), "--path"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()
    if Path(cached).is_file():
        return cached
    return shutil.which("helm")


def require_helm() -> str:
    """The helm binary; skips the test when it is not built (fails under ``HEALER_REQUIRE_KUBE=1``)."""
    binary = helm_binary()
    if binary is None:
        if os.environ.get("HEALER_REQUIRE_KUBE") == "1":
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    return binary


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO)


def template(helm: str, *args: str, kube_version: str = "1.29.0") -> subprocess.CompletedProcess[str]:
    """``helm template healer`` into namespace healer-system (default: the oldest Kubernetes we support)."""
    release = ("template", "healer", str(CHART), "--namespace", NAMESPACE)
    return run_helm(helm, *release, "--kube-version", kube_version, *args)


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def rendered_objects(helm: str, *args: str) -> list[dict[str, Any]]:
    """The chart's objects rendered with ``args`` (``--set``/``-f``); raises when helm refuses."""
    result = template(helm, *IMAGE, *args)
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr}")
    return documents(result.stdout)
