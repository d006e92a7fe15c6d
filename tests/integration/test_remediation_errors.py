"""Errors that must not escape: a slow eviction, a broken connection, a step retried after a failure.

Over HTTP against the API emulator, on SQLite and PostgreSQL: a Kubernetes call slower than the
request timeout (urllib3's ``ReadTimeoutError``) or a transport failure fails that node's step
only, never the pass for every node; a retried step records only the effects it performed.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.config import KubernetesSettings
from healer.model.states import ActionStatus, NodeState
from healer_dev.k8s_emulator import KubernetesEmulator, pod
from tests.integration.test_remediation import T0, Harness, fleet_nodes, hot, tick
from tests.k8s_emulator import emulator, k8s_settings

__all__ = ["emulator", "k8s_settings"]


@pytest.fixture
def harness(
    emulator: KubernetesEmulator, session_factory: sessionmaker[Session], k8s_settings: KubernetesSettings
) -> Iterator[Harness]:
    """A controller whose every Kubernetes request times out after 1 s."""
    h = Harness(emulator, session_factory, k8s_settings.model_copy(update={"request_timeout_seconds": 1}))
    yield h
    h.api.close()


def _web(name: str, node_name: str) -> dict[str, object]:
    return pod(
        name, node_name=node_name, namespace="web", owner=("ReplicaSet", "web-1"), labels={"app": "web"}
    )


def test_an_eviction_slower_than_the_timeout_fails_that_node_only(harness: Harness) -> None:
    harness.emu.load([*fleet_nodes(20), _web("web-a", "gpu-01"), _web("web-b", "gpu-02")])
    harness.remediate(tick(T0, hot("gpu-01"), hot("gpu-02")))
    assert {harness.state("gpu-01"), harness.state("gpu-02")} == {NodeState.DRAINING}
    harness.emu.inject_delay("POST", r"/pods/web-a/eviction$", 3)

    result = harness.drains(T0 + timedelta(seconds=10))  # no exception: the pass went on

    assert harness.emu.pods_on("gpu-02") == [], "the other node's drain went on"
    assert harness.state("gpu-02") == NodeState.AWAITING_REPAIR
    assert harness.state("gpu-01") == NodeState.DRAINING, "the slow node stays draining, to retry"
    assert [o.node for o in result.outcomes if o.error] == []
    drain = harness.actions_of("gpu-01", kind="drain")[-1]
    assert drain.status == ActionStatus.RUNNING
    assert drain.detail is not None and drain.detail["remaining"] == ["web/web-a"]

    # The slow eviction did happen server-side; the next round sees the pod gone and finishes.
    harness.drains(T0 + timedelta(seconds=20))
    assert harness.state("gpu-01") == NodeState.AWAITING_REPAIR


def test_a_connection_error_fails_that_node_step_only(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    harness.emu.inject_delay("PATCH", r"/api/v1/nodes/gpu-04$", 3)  # the cordon patch times out

    result = harness.remediate(tick(T0, hot("gpu-04"), hot("gpu-05")))

    errors = {o.node: o.error for o in result.outcomes if o.error}
    assert list(errors) == ["gpu-04"] and "ReadTimeoutError" in str(errors["gpu-04"])
    assert harness.state("gpu-05") == NodeState.DRAINING
    failed = harness.actions_of("gpu-04", status=ActionStatus.FAILED)
    assert [a.kind for a in failed] == ["cordon"] and "timed out" in (failed[0].error or "")


def test_a_retried_step_records_each_effect_once(harness: Harness) -> None:
    harness.emu.load(fleet_nodes(20))
    # The condition (a status patch) fails once: cordon and taint were done, the step was not.
    harness.emu.inject_error("PATCH", r"/api/v1/nodes/gpu-06/status$", 500)

    first = harness.remediate(tick(T0, hot("gpu-06")))
    assert [o.node for o in first.outcomes if o.error] == ["gpu-06"]
    harness.remediate(tick(T0 + timedelta(seconds=30), hot("gpu-06")))

    assert harness.state("gpu-06") == NodeState.DRAINING
    done = [(a.kind, a.status) for a in harness.actions_of("gpu-06")]
    assert done.count(("cordon", ActionStatus.SUCCEEDED)) == 1
    assert done.count(("taint", ActionStatus.SUCCEEDED)) == 1
    assert done.count(("condition", ActionStatus.SUCCEEDED)) == 1
    assert done.count(("setcondition", ActionStatus.FAILED)) == 1
