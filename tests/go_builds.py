"""Tests that start while the Go-built test tools are still building (a cold ``.ci/run``).

``.ci/run`` builds the Kubernetes control plane (``tests/kube/build.sh``), the virtual-kubelet node
(``tests/kube/build-vk.sh``), helm (``deploy/scripts/build-helm.sh``), Prometheus 3
(``tests/prometheus3/build.sh``) and the container image (``deploy/scripts/build-image-offline.sh``)
in the background and starts the tests at once; each build writes its exit status to a file when it
ends, named by ``HEALER_KUBE_BUILD_STATUS``, ``HEALER_VK_BUILD_STATUS``,
``HEALER_HELM_BUILD_STATUS``, ``HEALER_PROMETHEUS3_BUILD_STATUS`` and
``HEALER_IMAGE_BUILD_STATUS``. With those set, this plugin

- orders the tests that need a tool after all others (the same order on every xdist worker: it
  depends only on the tests), so the other tests run while the tools build;
- before such a test, waits for its tools' status files, outside the test's own timeout
  (pytest-timeout times the test from inside this wait), up to :data:`WAIT_SECONDS`.

Without the variables (a developer's ``make test``, a warm cache) nothing changes. A build that
failed writes a non-zero status; the tests then fail as they do without the tool, naming the
build's command, and ``.ci/run`` prints the build's log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

KUBE_STATUS = "HEALER_KUBE_BUILD_STATUS"
HELM_STATUS = "HEALER_HELM_BUILD_STATUS"
VK_STATUS = "HEALER_VK_BUILD_STATUS"
PROMETHEUS3_STATUS = "HEALER_PROMETHEUS3_BUILD_STATUS"
IMAGE_STATUS = "HEALER_IMAGE_BUILD_STATUS"
#: Longest wait for a build (a cold control plane build takes about 12 minutes on 2 cores).
WAIT_SECONDS = 45 * 60
#: Fixtures that start the control plane (``tests/conftest.py``).
KUBE_FIXTURES = frozenset({"kube"})
#: Fixtures that start a virtual-kubelet node on it (``tests/conftest.py``).
VK_FIXTURES = frozenset({"vk_node"})
#: The fixture that finds the Prometheus 3 build (``tests/conftest.py``).
PROMETHEUS3_FIXTURES = frozenset({"prometheus3"})
#: The fixture of the image built by ``deploy/scripts/build-image-offline.sh`` (tests/e2e/test_image.py).
IMAGE_FIXTURES = frozenset({"healer_image"})


def _uses_helm(module: ModuleType | None) -> bool:
    """Whether the test module calls into ``tests/helm.py`` (imports one of its functions)."""
    if module is None:
        return False
    return any(getattr(v, "__module__", None) == "tests.helm" for v in vars(module).values())


def needs(item: pytest.Item) -> tuple[str, ...]:
    """The status variables of the tools ``item`` needs: the control plane (and helm, whose chart
    gives healer's RBAC) for a test using the ``kube`` fixture or parametrized with "kube" (and the
    virtual-kubelet node for one using ``vk_node``), helm for a test module using it, Prometheus 3
    for a test using the ``prometheus3`` fixture, the container image for a test using the
    ``healer_image`` fixture."""
    fixtures = set(getattr(item, "fixturenames", ()))
    # A fixture parametrized over clusters asks for ``kube`` by name when its parameter is "kube"
    # (test_k8s_contract.py's ``cluster``): that is not in ``fixturenames``, the parameter is.
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(isinstance(value, str) and value in KUBE_FIXTURES for value in params.values()):
        fixtures |= KUBE_FIXTURES
    found: tuple[str, ...] = ()
    if fixtures & VK_FIXTURES:
        found = (KUBE_STATUS, HELM_STATUS, VK_STATUS)
    elif fixtures & KUBE_FIXTURES:
        found = (KUBE_STATUS, HELM_STATUS)
    elif _uses_helm(getattr(item, "module", None)):
        found = (HELM_STATUS,)
    if fixtures & PROMETHEUS3_FIXTURES:
        found = (*found, PROMETHEUS3_STATUS)
    if fixtures & IMAGE_FIXTURES:
        found = (*found, IMAGE_STATUS)
    return found


def _building() -> bool:
    return any(
        os.environ.get(v)
        for v in (KUBE_STATUS, HELM_STATUS, VK_STATUS, PROMETHEUS3_STATUS, IMAGE_STATUS)
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """While the tools build, the tests needing them run last (a stable sort: otherwise in order)."""
    if _building():
        items.sort(key=lambda item: bool(needs(item)))


def wait_for_status(variable: str, *, timeout: float = WAIT_SECONDS) -> str | None:
    """The exit status the build named by ``variable`` wrote, waiting for it; None when the
    variable is unset or the build did not end within ``timeout`` seconds."""
    path = os.environ.get(variable)
    if not path:
        return None
    status = Path(path)
    end = time.monotonic() + timeout
    while not status.exists():
        if time.monotonic() >= end:
            return None
        time.sleep(2)  # a build takes minutes; its status file appears once
    return status.read_text().strip()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Before a test needing a tool, wait for its build (outside pytest-timeout's wrapper)."""
    for variable in needs(item) if _building() else ():
        wait_for_status(variable)
    yield
