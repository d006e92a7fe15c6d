"""Shared fixtures: real PostgreSQL (one server per session) and databases on both backends; a real
VictoriaMetrics (one per session); a real Alertmanager (one per session); a real Kubernetes control
plane (one per session, when built).

A service missing here skips the tests that need it, one line per service in the summary
(``tests/service_skips.py``); ``.ci/run`` installs them all and sets ``HEALER_REQUIRE_SERVICES=1``
and ``HEALER_REQUIRE_KUBE=1`` so a missing one fails instead."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from kubernetes.client import ApiClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from healer.store import migrate
from healer.store.session import make_engine, make_sessionmaker
from healer_dev.prometheus import prometheus3_bindir, prometheus_version
from tests.helm import NAMESPACE as HELM_NAMESPACE
from tests.helm import rendered_objects, require_helm
from tests.kube_cluster import BUILD_HINT, ControlPlane, control_plane, find_binaries
from tests.kube_cluster import REPORT as KUBE_REPORT
from tests.prometheus_releases import BUILD_HINT as PROMETHEUS3_BUILD_HINT
from tests.prometheus_releases import PrometheusRelease, debian_release
from tests.services import (
    AlertmanagerServer,
    PostgresServer,
    SharedVictoriaMetrics,
    SharedVmalert,
    alertmanager_server,
    postgres_server,
    shared_victoria_metrics,
    shared_vmalert,
)
from tests.virtual_kubelet import BUILD_HINT as VK_BUILD_HINT
from tests.virtual_kubelet import VirtualKubelet, virtual_kubelet
from tests.virtual_kubelet import find_binary as find_vk_binary

# A missing service skips (fails in CI), one line each; tests needing a Go-built tool wait for its
# build when .ci/run starts them while it builds (tests/go_builds.py).
pytest_plugins = ["tests.service_skips", "tests.go_builds"]

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
"""Exporter scrapes the tests serve (see each file's header for how it differs from a real scrape)."""


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the whole session."""
    with postgres_server() as server:
        yield server


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
"""The database backends every database fixture runs on."""

POSTGRES_TEMPLATE = "healer_template"
"""The database on the session's PostgreSQL server that holds the migrated schema."""


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per session (per xdist worker); tests get copies of it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "healer.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_template(postgres: PostgresServer) -> str:
    """The name of a PostgreSQL database migrated once per session; tests get copies of it."""
    migrate.upgrade(postgres.create_database(POSTGRES_TEMPLATE))
    return POSTGRES_TEMPLATE


@pytest.fixture
def migrated_sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A SQLite database with the schema in place: a copy of the session's migrated template."""
    path = tmp_path / "healer.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@contextlib.contextmanager
def _postgres_database(server: PostgresServer, *, template: str | None = None) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name, template=template)
    try:
        yield url
    finally:
        server.drop_database(name)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database URL, once on SQLite (a file) and once on PostgreSQL (a fresh database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'healer.db'}"
        return
    with _postgres_database(request.getfixturevalue("postgres")) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def migrated_db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database with the schema in place, on both backends: a copy of a template migrated once
    per session (``tests/integration/test_migrations.py`` runs the real migrations per backend)."""
    if request.param == "sqlite":
        yield request.getfixturevalue("migrated_sqlite_url")
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    with _postgres_database(server, template=request.getfixturevalue("postgres_template")) as url:
        yield url


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    eng = make_engine(migrated_db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def session_factory(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


# --- a real VictoriaMetrics (tests/services.py) ---------------------------------------------------


@pytest.fixture(scope="session")
def victoria_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedVictoriaMetrics]:
    """Single-node VictoriaMetrics on loopback for the session (Debian package ``victoria-metrics``),
    scraping every second the targets a test hands to ``scrape(file_sd)``; ``-search.latencyOffset=0s``
    so a query for now sees the last scrape; storage in a temporary directory, 1 day retention."""
    with shared_victoria_metrics(tmp_path_factory.mktemp("victoria-metrics")) as vm:
        yield vm


@pytest.fixture(scope="session")
def vmalert_victoria_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedVictoriaMetrics]:
    """A VictoriaMetrics of its own behind ``vmalert``, set up as ``victoria_metrics`` is: vmalert
    evaluates whatever the alerts-mode tests scrape into it, and the engine-agreement tests (whose
    fleet has the same node names) never share its storage."""
    with shared_victoria_metrics(tmp_path_factory.mktemp("vmalert-victoria-metrics")) as vm:
        yield vm


@pytest.fixture(scope="session")
def vmalert(
    vmalert_victoria_metrics: SharedVictoriaMetrics, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedVmalert]:
    """vmalert (Debian package ``victoria-metrics``) on loopback for the session, evaluating against
    ``vmalert_victoria_metrics`` the rule file a test hands to ``load(doc)``; queries unaligned
    (``-datasource.queryTimeAlignment=false``), notifications to a closed port."""
    with shared_vmalert(tmp_path_factory.mktemp("vmalert"), vmalert_victoria_metrics.url) as alert:
        yield alert


@pytest.fixture(scope="session")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlertmanagerServer]:
    """Alertmanager (Debian package ``prometheus-alertmanager``) on loopback for the session,
    clustering off, its data in a temporary directory; a test points it at its healer with
    ``deliver_to(url, token_file)`` (each alert its own group, sent at once)."""
    with alertmanager_server(workdir=tmp_path_factory.mktemp("alertmanager")) as server:
        yield server


# --- Prometheus 2.42 and 3.x (tests/prometheus_releases.py) ----------------------------------------


@pytest.fixture(scope="session")
def prometheus2() -> PrometheusRelease:
    """Debian's Prometheus and promtool (2.42 on Debian 12), found on PATH once per session."""
    return debian_release()


@pytest.fixture(scope="session")
def prometheus3() -> PrometheusRelease:
    """Prometheus and promtool 3.x as ``tests/prometheus3/build.sh`` caches them, once per session.

    Skips (one line saying how to build them) when they are not built, and fails instead when
    ``HEALER_REQUIRE_SERVICES=1`` (CI, which builds them in the background).
    """
    bindir = prometheus3_bindir()
    if bindir is None:
        message = f"no Prometheus 3 built: run `{PROMETHEUS3_BUILD_HINT}` (needs Go) to run these tests"
        if os.environ.get("HEALER_REQUIRE_SERVICES") == "1":
            pytest.fail(message + " (HEALER_REQUIRE_SERVICES=1)")
        pytest.skip(message)
    release = PrometheusRelease(bindir=bindir, version=prometheus_version(str(bindir / "prometheus")))
    assert release.major == 3, release
    return release


@pytest.fixture(scope="module")
def prometheus_release(prometheus2: PrometheusRelease) -> PrometheusRelease:
    """The Prometheus a test module runs on: Debian's 2.42; a ``*_prometheus3.py`` module that
    imports another module's tests overrides it with ``prometheus3``."""
    return prometheus2


# --- a real Kubernetes control plane (tests/kube_cluster.py) --------------------------------------


def _not_built(what: str, hint: str) -> NoReturn:
    """Skip the test needing ``what``, saying how to build it; fail with ``HEALER_REQUIRE_KUBE=1``."""
    message = f"no {what} built: run `{hint}` (needs Go) to run these tests"
    if os.environ.get("HEALER_REQUIRE_KUBE") == "1":
        pytest.fail(message + " (HEALER_REQUIRE_KUBE=1)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def kube() -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK for the session.

    Skips (one line saying how to build them) when the binaries are not built, and fails instead
    when ``HEALER_REQUIRE_KUBE=1`` (CI).
    """
    bindir = find_binaries()
    if bindir is None:
        _not_built("Kubernetes control plane", BUILD_HINT)
    with control_plane(bindir) as cp:
        yield cp


@pytest.fixture(scope="session")
def kube_healer_token(kube: ControlPlane) -> str:
    """A token of ServiceAccount ``healer-system/healer``, bound by the Helm chart's RBAC (not admin).

    The chart is rendered (``helm template``) and only its ServiceAccount and RBAC objects are
    applied, so a verb the chart does not grant fails the test that needs it.
    """
    rbac_kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    objects = [o for o in rendered_objects(require_helm()) if o["kind"] in rbac_kinds]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HELM_NAMESPACE}}
    kube.apply([namespace, *objects])
    return kube.service_account_token(HELM_NAMESPACE, "healer")


@pytest.fixture
def kube_healer_api(kube: ControlPlane, kube_healer_token: str) -> Iterator[ApiClient]:
    """An ``ApiClient`` that is healer: its ServiceAccount, its ClusterRole, nothing more."""
    with kube.client(kube_healer_token) as api:
        yield api


@pytest.fixture
def kube_admin(kube: ControlPlane) -> Iterator[ApiClient]:
    """A cluster-admin ``ApiClient`` for test set-up and assertions."""
    with kube.admin_client() as api:
        yield api


# --- a virtual-kubelet node on that control plane (tests/virtual_kubelet.py) ---------------------


@pytest.fixture(scope="module")
def vk_node_name() -> str:
    """The virtual node's name; a test module overrides this fixture to choose its own."""
    return "virtual-kubelet"


@pytest.fixture(scope="module")
def vk_node_gpus() -> int:
    """The virtual node's ``nvidia.com/gpu`` capacity; a test module overrides it to choose."""
    return 16


@pytest.fixture(scope="module")
def vk_node(kube: ControlPlane, vk_node_name: str, vk_node_gpus: int) -> Iterator[VirtualKubelet]:
    """A virtual-kubelet node (``tests/kube/vk``) registered on the session's control plane for
    one test module (the other modules' tests see no extra node); stopped, its Node deleted, at
    the module's end. Skips, or fails with ``HEALER_REQUIRE_KUBE=1``, when it is not built."""
    binary = find_vk_binary()
    if binary is None:
        _not_built("virtual-kubelet", VK_BUILD_HINT)
    with virtual_kubelet(kube, binary, name=vk_node_name, gpus=vk_node_gpus) as vk:
        yield vk


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in KUBE_REPORT:
        terminalreporter.write_line(line)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): one worker per core, and one more on a machine of one
    or two cores. Most of the suite waits on real clocks (``for`` holds, scrapes, leases), not on
    the CPUs: with two workers on CI's two cores they were 53 % busy during the tests
    (``.ci/run`` prints it). Each worker starts its own services, so more than one extra buys
    little."""
    cores = os.cpu_count() or 1
    return cores + 1 if cores <= 2 else cores
