"""How a drain reads the API server's eviction answers and terminating pods (pure parts)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from kubernetes import client as k8s

from healer.actions.drain import is_budget_block, still_present
from healer_dev.k8s_emulator import pod

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

#: kube-apiserver's createTooManyRequestsError (pkg/registry/core/pod/storage/eviction.go).
PDB_429 = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {
        "causes": [
            {"reason": "DisruptionBudget", "message": "The disruption budget web needs 1 healthy pods"}
        ],
        "retryAfterSeconds": 10,
    },
    "code": 429,
}
#: API priority and fairness.
APF_429 = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": "Too many requests, please try again later.",
    "reason": "TooManyRequests",
    "details": {"retryAfterSeconds": 1},
    "code": 429,
}


def test_a_429_is_a_budget_block_only_with_the_disruption_budget_cause() -> None:
    assert is_budget_block(json.dumps(PDB_429))
    assert not is_budget_block(json.dumps(APF_429))
    assert not is_budget_block("Too many requests")
    assert not is_budget_block(None)


def terminating(name: str, since: datetime) -> k8s.V1Pod:
    obj = pod(name, node_name="n")
    obj["metadata"]["deletionTimestamp"] = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    obj["metadata"]["uid"] = "u-" + name
    return k8s.V1Pod.from_dict(obj)


def test_pods_terminating_past_the_limit_count_as_gone_only_when_a_limit_applies() -> None:
    old = terminating("old", NOW - timedelta(minutes=6))
    young = terminating("young", NOW - timedelta(minutes=1))
    pods = [old, young]
    assert [p.metadata.name for p in still_present(pods, NOW, 300.0)] == ["young"]
    assert still_present(pods, NOW, None) == pods  # a Ready node: its kubelet will confirm
    assert still_present(pods, NOW, 0.0) == pods  # 0 = wait forever
