"""A service the tests use that this machine lacks skips the tests that need it, with one line in
pytest's summary per service; CI fails them instead (``HEALER_REQUIRE_SERVICES=1``, set by
``.ci/run`` once it has installed them).

Services are the binaries of Debian packages (PostgreSQL, Prometheus and promtool,
VictoriaMetrics and vmalert, Alertmanager, node_exporter, Chromium). Every way the tests reach one
raises :class:`~healer.errors.BinaryNotFound` when it is missing:
:func:`healer.sources.local_server.find_binary` (Prometheus, promtool, VictoriaMetrics, vmalert,
Alertmanager), the node_exporter and PostgreSQL helpers, and
:func:`require_binary` where a test runs a binary itself. The hooks below turn that error, in a
fixture or in a test, into a skip. Loaded by ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator

import pytest

from healer.errors import BinaryNotFound

REQUIRE = "HEALER_REQUIRE_SERVICES"
"""Set to 1 (``.ci/run``): a missing service fails its tests instead of skipping them."""

HINT = "install it to run these tests (bash .ci/run installs every service they use)"


def require_binary(name: str, *, package: str) -> str:
    """The path of ``name`` on PATH; raises :class:`BinaryNotFound` (a skip, or a failure in CI)."""
    found = shutil.which(name)
    if found is None:
        raise BinaryNotFound(name, package=package)
    return found


def _skip_when_missing() -> Generator[None, object, object]:
    try:
        return (yield)
    except BinaryNotFound as exc:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{exc} ({REQUIRE}=1)", pytrace=False)
        pytest.skip(f"{exc}: {HINT}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _skip_when_missing())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _skip_when_missing())
