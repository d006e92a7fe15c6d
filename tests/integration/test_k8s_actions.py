"""The Kubernetes adapter, drain and Lease election over HTTP against the API emulator.

Everything goes through the official client to a real HTTP server; nothing is monkeypatched.
Time is a parameter: deadline tests pass ``now`` values instead of sleeping.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.actions import drain as drain_mod
from healer.actions.apiretry import READ_ATTEMPTS
from healer.actions.base import (
    DrainOptions,
    DrainReport,
    NodeActions,
    Ownership,
    human_uncordoned,
    incident_of,
)
from healer.actions.dryrun import RecordingNodeActions
from healer.actions.kubernetes import STRATEGIC_MERGE, KubernetesNodeActions, make_api_client
from healer.actions.lease import LeaderElector
from healer.config import KubernetesSettings
from healer.errors import ConfigError, KubernetesError, KubernetesNotFound
from healer.store.models import Action
from healer.store.nodes import ensure_incident, get_or_create_node
from healer.store.session import transaction
from healer_dev.k8s_emulator import (
    KubernetesEmulator,
    gpu_fleet,
    namespace,
    node,
    pod,
    pod_disruption_budget,
)
from tests.k8s_emulator import emulator, k8s_api, k8s_settings

__all__ = ["emulator", "k8s_api", "k8s_settings"]

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NODE = "gpu-7"
OWNERSHIP = Ownership(incident_id=42, reason="XidCritical: Xid 79 on GPU 3", at=T0)


@pytest.fixture
def actions(k8s_api: ApiClient, k8s_settings: KubernetesSettings) -> KubernetesNodeActions:
    return KubernetesNodeActions(k8s_api, k8s_settings, identity="healer-0", clock=lambda: T0)


def drain(
    actions: NodeActions,
    *,
    now: datetime = T0,
    timeout: float = 600,
    delete_emptydir_data: bool = False,
    ignore_daemonsets: bool = True,
    force: bool = False,
    delete_after_timeout: bool = False,
) -> DrainReport:
    options = DrainOptions(
        timeout_seconds=timeout,
        grace_period_seconds=-1,
        delete_emptydir_data=delete_emptydir_data,
        ignore_daemonsets=ignore_daemonsets,
        force=force,
        delete_after_timeout=delete_after_timeout,
        concurrency=4,
    )
    return actions.drain_step(NODE, started_at=T0, now=now, options=options)


#: One pod on NODE that two PodDisruptionBudgets select (the Eviction API answers 500).
TWO_BUDGETS_ON_ONE_POD = [
    node(NODE),
    pod("web-1", node_name=NODE, labels={"app": "web", "tier": "front"}),
    pod_disruption_budget("by-app", match_labels={"app": "web"}, max_unavailable=5),
    pod_disruption_budget("by-tier", match_labels={"tier": "front"}, max_unavailable=5),
]


def node_obj(emu: KubernetesEmulator, name: str = NODE) -> dict[str, Any]:
    found = emu.get("Node", name)
    assert found is not None
    return found


def human_patch(api: ApiClient, body: dict[str, Any], name: str = NODE) -> None:
    """What ``kubectl cordon/uncordon`` sends: a strategic-merge patch of the node."""
    k8s.CoreV1Api(api).patch_node(name, body, _content_type=STRATEGIC_MERGE)


# --- quarantine --------------------------------------------------------------------------------


class TestQuarantine:
    def test_quarantine_shows_everything_on_the_node(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
        emulator.add(node(NODE, taints=[other]))

        actions.cordon(NODE, OWNERSHIP)
        actions.taint(NODE, value="xid-critical", effect="NoSchedule")
        actions.set_condition(NODE, healthy=False, reason="XidCritical", message="Xid 79 on GPU 3", now=T0)
        actions.event(NODE, reason="HealerQuarantined", message="Xid 79 on GPU 3: cordoned and tainted")

        obj = node_obj(emulator)
        assert obj["spec"]["unschedulable"] is True
        assert other in obj["spec"]["taints"]
        assert {"key": "healer.dev/quarantined", "value": "xid-critical", "effect": "NoSchedule"} in obj[
            "spec"
        ]["taints"]
        conditions = {c["type"]: c for c in obj["status"]["conditions"]}
        assert conditions["Ready"]["status"] == "True"  # the kubelet's condition is untouched
        gpu = conditions["GpuHealthy"]
        assert (gpu["status"], gpu["reason"], gpu["message"]) == ("False", "XidCritical", "Xid 79 on GPU 3")
        assert gpu["lastTransitionTime"] == "2026-03-01T12:00:00Z"
        ann = obj["metadata"]["annotations"]
        assert ann["healer.dev/cordoned-by"] == "healer"
        assert ann["healer.dev/incident"] == "42"
        assert ann["healer.dev/reason"] == OWNERSHIP.reason
        assert ann["healer.dev/since"] == "2026-03-01T12:00:00Z"
        (event,) = emulator.list("Event", "default", api_version="events.k8s.io/v1")
        assert event["regarding"] == {
            "apiVersion": "v1",
            "kind": "Node",
            "name": NODE,
            "uid": obj["metadata"]["uid"],
        }
        assert (event["reason"], event["type"]) == ("HealerQuarantined", "Warning")
        assert event["reportingController"] == "healer.dev/healer"
        assert event["reportingInstance"] == "healer-0"

        view = actions.read_node(NODE)
        assert view.unschedulable
        assert view.conditions["GpuHealthy"] == "False"
        assert ("healer.dev/quarantined", "xid-critical", "NoSchedule") in view.taints
        assert incident_of(view, domain="healer.dev") == 42

    def test_every_step_is_idempotent(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.add(node(NODE))
        actions.cordon(NODE, OWNERSHIP)
        actions.taint(NODE, value="xid", effect="NoSchedule")
        actions.set_condition(NODE, healthy=False, reason="Xid", message="m", now=T0)
        before = node_obj(emulator)["metadata"]["resourceVersion"]
        writes = len([r for r in emulator.requests if r[0] == "PATCH"])

        later = Ownership(incident_id=42, reason=OWNERSHIP.reason, at=T0 + timedelta(minutes=5))
        actions.cordon(NODE, later)
        actions.taint(NODE, value="xid", effect="NoSchedule")
        actions.set_condition(NODE, healthy=False, reason="Xid", message="m", now=T0 + timedelta(minutes=5))

        after = node_obj(emulator)
        assert after["metadata"]["resourceVersion"] == before
        assert len([r for r in emulator.requests if r[0] == "PATCH"]) == writes
        assert after["metadata"]["annotations"]["healer.dev/since"] == "2026-03-01T12:00:00Z"
        assert [t["key"] for t in after["spec"]["taints"]].count("healer.dev/quarantined") == 1

    def test_a_new_taint_value_replaces_healers_old_one(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.add(node(NODE))
        actions.taint(NODE, value="hot-gpu", effect="PreferNoSchedule")
        actions.taint(NODE, value="xid", effect="NoExecute")
        assert node_obj(emulator)["spec"]["taints"] == [
            {"key": "healer.dev/quarantined", "value": "xid", "effect": "NoExecute"}
        ]

    def test_condition_transition_time_moves_only_when_status_flips(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.add(node(NODE))
        actions.set_condition(NODE, healthy=False, reason="HotGpu", message="92 C", now=T0)
        actions.set_condition(
            NODE, healthy=False, reason="HotGpu", message="95 C", now=T0 + timedelta(minutes=1)
        )
        cond = next(c for c in node_obj(emulator)["status"]["conditions"] if c["type"] == "GpuHealthy")
        assert (cond["message"], cond["lastTransitionTime"]) == ("95 C", "2026-03-01T12:00:00Z")
        actions.set_condition(
            NODE, healthy=True, reason="Recovered", message="ok", now=T0 + timedelta(hours=1)
        )
        cond = next(c for c in node_obj(emulator)["status"]["conditions"] if c["type"] == "GpuHealthy")
        assert (cond["status"], cond["lastTransitionTime"]) == ("True", "2026-03-01T13:00:00Z")

    def test_a_taint_race_is_retried_and_keeps_the_other_writers_taint(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.add(node(NODE))
        # The first taint PATCH answers 409, as when another writer moved resourceVersion on.
        emulator.inject_error("PATCH", rf"/api/v1/nodes/{NODE}$", 409)
        actions.taint(NODE, value="xid", effect="NoSchedule")
        assert [t["key"] for t in node_obj(emulator)["spec"]["taints"]] == ["healer.dev/quarantined"]

    def test_missing_node_and_api_errors_are_typed(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        with pytest.raises(KubernetesNotFound) as missing:
            actions.cordon("no-such-node", OWNERSHIP)
        assert missing.value.status == 404
        assert isinstance(missing.value.__cause__, ApiException)
        emulator.add(node(NODE))
        emulator.inject_error("GET", rf"/api/v1/nodes/{NODE}$", 503, times=READ_ATTEMPTS)  # every try
        with pytest.raises(KubernetesError) as failed:
            actions.read_node(NODE)
        assert failed.value.status == 503
        assert isinstance(failed.value.__cause__, ApiException)


# --- humans and release ------------------------------------------------------------------------


class TestOwnership:
    def test_human_uncordon_is_detected_and_the_drain_stops(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions, k8s_api: ApiClient
    ) -> None:
        emulator.load([node(NODE), pod("web-1", node_name=NODE)])
        actions.cordon(NODE, OWNERSHIP)
        assert not human_uncordoned(actions.read_node(NODE), domain="healer.dev")

        human_patch(k8s_api, {"spec": {"unschedulable": None}})  # kubectl uncordon

        assert human_uncordoned(actions.read_node(NODE), domain="healer.dev")
        assert actions.human_uncordoned(NODE)
        report = drain(actions)
        assert report.stopped and not report.done
        assert not emulator.evictions
        assert emulator.pods_on(NODE) == ["default/web-1"]

    def test_release_uncordons_only_what_healer_cordoned(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        other = {"key": "example.com/maintenance", "effect": "NoSchedule"}
        emulator.add(node(NODE, taints=[other]))
        actions.cordon(NODE, OWNERSHIP)
        actions.taint(NODE, value="xid", effect="NoSchedule")
        actions.set_condition(NODE, healthy=False, reason="Xid", message="m", now=T0)

        actions.release(NODE, now=T0 + timedelta(hours=2))

        obj = node_obj(emulator)
        assert not obj["spec"].get("unschedulable")
        assert obj["spec"]["taints"] == [other]
        assert not any(k.startswith("healer.dev/") for k in obj["metadata"]["annotations"])
        cond = next(c for c in obj["status"]["conditions"] if c["type"] == "GpuHealthy")
        assert (cond["status"], cond["lastTransitionTime"]) == ("True", "2026-03-01T14:00:00Z")

    def test_release_never_undoes_a_humans_cordon(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.add(node(NODE, unschedulable=True))  # an admin cordoned it before healer came
        actions.cordon(NODE, OWNERSHIP)
        actions.taint(NODE, value="xid", effect="NoSchedule")
        ann = node_obj(emulator)["metadata"]["annotations"]
        assert "healer.dev/cordoned-by" not in ann
        assert ann["healer.dev/incident"] == "42"

        actions.release(NODE)

        obj = node_obj(emulator)
        assert obj["spec"]["unschedulable"] is True
        assert not obj["spec"].get("taints")
        assert not any(k.startswith("healer.dev/") for k in obj["metadata"]["annotations"])

    def test_release_of_an_untouched_node_changes_nothing(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.add(node(NODE))
        rv = node_obj(emulator)["metadata"]["resourceVersion"]
        actions.release(NODE)
        assert node_obj(emulator)["metadata"]["resourceVersion"] == rv


# --- drain -------------------------------------------------------------------------------------


def _workload(**extra: Any) -> list[dict[str, Any]]:
    return [
        node(NODE),
        node("gpu-8"),
        pod("web-1", node_name=NODE, owner=("ReplicaSet", "web-5d8"), labels={"app": "web"}),
        pod("web-2", node_name=NODE, owner=("ReplicaSet", "web-5d8"), labels={"app": "web"}),
        pod("train-0", node_name=NODE, owner=("Job", "train"), namespace="training"),
        pod("dcgm-exporter-x", node_name=NODE, owner=("DaemonSet", "dcgm"), namespace="monitoring"),
        pod("kube-proxy-gpu-7", node_name=NODE, owner=None, mirror=True, namespace="kube-system"),
        pod("web-3", node_name="gpu-8", owner=("ReplicaSet", "web-5d8"), labels={"app": "web"}),
    ]


class TestDrain:
    def test_daemonset_and_mirror_pods_stay_others_are_evicted(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.load(_workload())
        actions.cordon(NODE, OWNERSHIP)

        report = drain(actions)

        assert report.done and not report.blocked and not report.refused
        assert report.evicted == ("default/web-1", "default/web-2", "training/train-0")
        assert report.kept == ("kube-system/kube-proxy-gpu-7", "monitoring/dcgm-exporter-x")
        assert sorted(emulator.pods_on(NODE)) == [
            "kube-system/kube-proxy-gpu-7",
            "monitoring/dcgm-exporter-x",
        ]
        assert emulator.pods_on("gpu-8") == ["default/web-3"]
        assert sorted(e.pod for e in emulator.evictions) == list(report.evicted)
        assert all(e.code == 201 for e in emulator.evictions)
        # the pods were listed by field selector, as kubectl does
        assert any("fieldSelector=spec.nodeName" in path for _, path in emulator.requests)

    def test_a_budget_that_never_allows_eviction_blocks_at_the_deadline(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.load(
            [
                node(NODE),
                pod("db-0", node_name=NODE, owner=("StatefulSet", "db"), labels={"app": "db"}),
                pod("web-1", node_name=NODE, labels={"app": "web"}),
                pod_disruption_budget("db-pdb", match_labels={"app": "db"}, min_available=1),
            ]
        )
        actions.cordon(NODE, OWNERSHIP)

        first = drain(actions, now=T0 + timedelta(seconds=5), timeout=300)
        assert not first.done and not first.blocked
        assert first.evicted == ("default/web-1",)
        assert first.remaining == ("default/db-0",)
        assert first.budgets == ("default/db-pdb",)

        before = drain(actions, now=T0 + timedelta(seconds=299), timeout=300)
        assert not before.blocked

        at = drain(actions, now=T0 + timedelta(seconds=300), timeout=300)
        assert at.blocked and not at.done
        assert at.blocked_pods == ("default/db-0",)
        assert at.budgets == ("default/db-pdb",)
        assert at.deleted == ()
        assert emulator.pods_on(NODE) == ["default/db-0"]
        # The budget's status said 0 disruptions allowed at every step: no eviction was POSTed for
        # it to refuse (issue 19; before, each step POSTed one and got 429).
        assert [e.code for e in emulator.evictions if e.pod == "default/db-0"] == []

    def test_delete_after_timeout_deletes_and_reports(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.load(
            [
                node(NODE),
                pod("db-0", node_name=NODE, owner=("StatefulSet", "db"), labels={"app": "db"}),
                pod_disruption_budget("db-pdb", match_labels={"app": "db"}, min_available="100%"),
            ]
        )
        actions.cordon(NODE, OWNERSHIP)
        early = drain(actions, now=T0 + timedelta(seconds=10), timeout=60, delete_after_timeout=True)
        assert early.deleted == () and emulator.pods_on(NODE) == ["default/db-0"]

        late = drain(actions, now=T0 + timedelta(seconds=61), timeout=60, delete_after_timeout=True)

        assert late.deleted == ("default/db-0",)
        assert late.done and not late.blocked
        assert emulator.pods_on(NODE) == []
        assert ("DELETE", "/api/v1/namespaces/default/pods/db-0") in emulator.requests

    def test_emptydir_and_unmanaged_pods_are_refused_before_anything_is_evicted(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.load(
            [
                *_workload(),
                pod("scratch-0", node_name=NODE, owner=("Job", "prep"), empty_dir=True),
                pod("debug", node_name=NODE, owner=None),
                pod("done-0", node_name=NODE, owner=None, empty_dir=True, phase="Succeeded"),
            ]
        )
        actions.cordon(NODE, OWNERSHIP)

        report = drain(actions)

        assert not report.done
        assert set(report.refused) == {"default/scratch-0", "default/debug"}
        assert "emptyDir" in report.refused["default/scratch-0"]
        assert "controller" in report.refused["default/debug"]
        assert not emulator.evictions

        allowed = drain(actions, delete_emptydir_data=True, force=True)
        assert allowed.done
        assert {"default/scratch-0", "default/debug", "default/done-0"} <= set(allowed.evicted)

    def test_daemonset_pods_are_refused_unless_ignored(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.load(_workload())
        actions.cordon(NODE, OWNERSHIP)
        report = drain(actions, ignore_daemonsets=False)
        assert report.refused == {
            "monitoring/dcgm-exporter-x": "DaemonSet-managed pod (ignore_daemonsets is off)"
        }
        assert not emulator.evictions

    def test_a_restarted_drain_resumes_without_duplicating_evictions(
        self, k8s_settings: KubernetesSettings
    ) -> None:
        with KubernetesEmulator(terminating_seconds=3600) as emu:
            emu.load(
                [
                    *_workload(),
                    pod("inf-0", node_name=NODE, labels={"app": "inf"}, owner=("ReplicaSet", "inf-1")),
                    pod("inf-1", node_name=NODE, labels={"app": "inf"}, owner=("ReplicaSet", "inf-1")),
                    pod_disruption_budget("inf", match_labels={"app": "inf"}, max_unavailable=1),
                ]
            )
            with emu.api_client() as api:
                first = KubernetesNodeActions(api, k8s_settings)
                first.cordon(NODE, OWNERSHIP)
                one = drain(first, now=T0 + timedelta(seconds=1))
                assert len(one.evicted) == 4  # web-1, web-2, train-0, one of inf-*
                assert not one.done
            # the controller dies; evicted pods are still terminating
            with emu.api_client() as api:
                second = KubernetesNodeActions(api, k8s_settings)
                two = drain(second, now=T0 + timedelta(seconds=20))
                assert two.evicted == ()  # terminating pods are waited for, not evicted again
                assert set(one.evicted) <= set(two.remaining)
                emu.finish_terminating()
                emu.reschedule_evicted("gpu-8")  # the evicted inference replica is Ready elsewhere
                three = drain(second, now=T0 + timedelta(seconds=40))
                emu.finish_terminating()
                four = drain(second, now=T0 + timedelta(seconds=60))
            assert len(three.evicted) == 1 and four.done
            assert sorted(set(one.evicted) | set(three.evicted)) == sorted(
                ["default/web-1", "default/web-2", "training/train-0", "default/inf-0", "default/inf-1"]
            )
            for key in (*one.evicted, *three.evicted):
                assert emu.eviction_count(key) == 1

    def test_a_pod_replaced_under_the_same_name_counts_as_gone(
        self, emulator: KubernetesEmulator, k8s_api: ApiClient
    ) -> None:
        emulator.load([node(NODE), pod("web-1", node_name=NODE)])
        core = k8s.CoreV1Api(k8s_api)
        (stale,) = drain_mod.list_node_pods(core, NODE, request_timeout=5)
        emulator.delete("Pod", "web-1", "default")
        emulator.add(pod("web-1", node_name=NODE))  # same name, new uid

        outcome, _ = drain_mod._evict(core, stale, -1, 5)

        assert outcome is drain_mod.Outcome.GONE
        assert emulator.pods_on(NODE) == ["default/web-1"]  # the new pod was not evicted

    def test_several_budgets_on_one_pod_block_and_are_all_named(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.load(TWO_BUDGETS_ON_ONE_POD)
        actions.cordon(NODE, OWNERSHIP)
        report = drain(actions, now=T0 + timedelta(hours=1), timeout=60)
        assert report.blocked
        assert report.blocked_pods == ("default/web-1",)
        assert report.budgets == ("default/by-app", "default/by-tier")

    def test_several_budgets_block_at_once_long_before_the_deadline(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        """500 "more than one PodDisruptionBudget": no retry can succeed, so no waiting for it."""
        emulator.load(TWO_BUDGETS_ON_ONE_POD)
        actions.cordon(NODE, OWNERSHIP)
        report = drain(actions, now=T0 + timedelta(seconds=1), timeout=3600)
        assert report.blocked and not report.done
        assert report.blocked_pods == ("default/web-1",)
        assert report.budgets == ("default/by-app", "default/by-tier")

    def test_a_429_without_a_budget_cause_is_a_rate_limit_not_a_block(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        """Priority and fairness also answers 429, with no DisruptionBudget cause: retried after
        Retry-After, and never reported as a budget holding the pod."""
        emulator.load([node(NODE), pod("web-1", node_name=NODE), pod("web-2", node_name=NODE)])
        actions.cordon(NODE, OWNERSHIP)
        emulator.inject_error("POST", r"/pods/web-1/eviction$", 429, times=1)
        once = drain(actions, now=T0 + timedelta(seconds=1), timeout=60)
        assert once.evicted == ("default/web-1", "default/web-2") and once.done  # retried in the step

        emulator.load([pod("web-3", node_name=NODE)])
        emulator.inject_error("POST", r"/pods/web-3/eviction$", 429, times=2)
        late = drain(actions, now=T0 + timedelta(seconds=61), timeout=60)
        assert not late.blocked and late.budgets == () and late.errors == {}
        assert late.remaining == ("default/web-3",)
        assert drain(actions, now=T0 + timedelta(seconds=62), timeout=60).done

    def test_a_failing_eviction_is_retried_then_ends_blocked_at_the_deadline(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.load([node(NODE), pod("web-1", node_name=NODE)])
        actions.cordon(NODE, OWNERSHIP)
        emulator.inject_error("POST", r"/pods/web-1/eviction$", 403, times=2)
        early = drain(actions, now=T0 + timedelta(seconds=1), timeout=60)
        assert not early.done and not early.blocked
        assert "HTTP 403" in early.errors["default/web-1"]
        late = drain(actions, now=T0 + timedelta(seconds=61), timeout=60)
        assert late.blocked and late.blocked_pods == ("default/web-1",) and late.budgets == ()
        assert drain(actions, now=T0 + timedelta(seconds=62), timeout=60).done  # the API recovered

    def test_a_deleted_node_raises_not_found(
        self, emulator: KubernetesEmulator, actions: KubernetesNodeActions
    ) -> None:
        emulator.add(node(NODE))
        actions.cordon(NODE, OWNERSHIP)
        emulator.delete("Node", NODE)
        with pytest.raises(KubernetesNotFound):
            drain(actions)


# --- leader election ---------------------------------------------------------------------------


class TestLease:
    @pytest.fixture(autouse=True)
    def _lease_namespace(self, emulator: KubernetesEmulator) -> None:
        emulator.add(namespace("healer-system"))

    def test_create_renew_and_takeover_after_expiry(
        self, emulator: KubernetesEmulator, k8s_api: ApiClient, k8s_settings: KubernetesSettings
    ) -> None:
        a = LeaderElector(k8s_api, k8s_settings, identity="healer-a")
        b = LeaderElector(k8s_api, k8s_settings, identity="healer-b")

        assert a.try_acquire_or_renew(T0) and a.is_leader
        assert not b.try_acquire_or_renew(T0 + timedelta(seconds=1))
        assert a.try_acquire_or_renew(T0 + timedelta(seconds=5))
        assert not b.try_acquire_or_renew(T0 + timedelta(seconds=6))  # b sees the renewal at 6
        assert not b.try_acquire_or_renew(T0 + timedelta(seconds=20))  # unchanged for 14 s only
        # the leader stops acting at its renew deadline (2/3 of the 15 s), before any takeover
        assert a.still_leader(T0 + timedelta(seconds=14))
        assert not a.still_leader(T0 + timedelta(seconds=15))

        assert b.try_acquire_or_renew(T0 + timedelta(seconds=21))  # unchanged for 15 s: a stopped
        assert not a.try_acquire_or_renew(T0 + timedelta(seconds=22))
        assert not a.is_leader
        lease = emulator.get("Lease", "healer-leader", "healer-system", api_version="coordination.k8s.io/v1")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "healer-b"
        assert lease["spec"]["leaseTransitions"] == 1

    def test_release_lets_the_other_replica_lead_at_once(
        self, emulator: KubernetesEmulator, k8s_api: ApiClient, k8s_settings: KubernetesSettings
    ) -> None:
        a = LeaderElector(k8s_api, k8s_settings, identity="healer-a")
        b = LeaderElector(k8s_api, k8s_settings, identity="healer-b")
        assert a.try_acquire_or_renew(T0)
        a.release(T0 + timedelta(seconds=1))
        assert not a.is_leader
        assert b.try_acquire_or_renew(T0 + timedelta(seconds=2))

    def test_two_electors_never_both_lead(
        self, emulator: KubernetesEmulator, k8s_settings: KubernetesSettings
    ) -> None:
        """Both replicas race every round at the same instants (after expiries too); 409 decides."""
        clients = [emulator.api_client(), emulator.api_client()]
        electors = [LeaderElector(c, k8s_settings, identity=f"healer-{i}") for i, c in enumerate(clients)]
        try:
            for round_no in range(40):
                # every third round the holder "pauses" for a lease duration, forcing a takeover race
                now = T0 + timedelta(seconds=round_no * 5 + (round_no // 3) * 15)
                results: list[bool] = [False, False]
                barrier = threading.Barrier(2)

                def run(i: int, at: datetime, barrier: threading.Barrier, results: list[bool]) -> None:
                    barrier.wait()
                    results[i] = electors[i].try_acquire_or_renew(at)

                threads = [threading.Thread(target=run, args=(i, now, barrier, results)) for i in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert results.count(True) <= 1, f"round {round_no}: both lead"
                assert sum(e.still_leader(now) for e in electors) <= 1
        finally:
            for c in clients:
                c.close()

    def test_a_renewal_applied_whose_answer_was_lost_is_not_a_lost_lease(
        self, emulator: KubernetesEmulator, k8s_api: ApiClient, k8s_settings: KubernetesSettings
    ) -> None:
        """The HTTP client sends a PUT again when its answer is lost; the API server, which applied
        the first, answers the second 409. That is this replica's own write, not a rival's."""
        a = LeaderElector(k8s_api, k8s_settings, identity="healer-a")
        assert a.try_acquire_or_renew(T0)
        real = a.api.replace_namespaced_lease

        def applied_then_conflict(*args: Any, **kwargs: Any) -> Any:
            real(*args, **kwargs)
            raise ApiException(status=409, reason="Conflict")

        a.api.replace_namespaced_lease = applied_then_conflict  # type: ignore[method-assign]
        assert a.try_acquire_or_renew(T0 + timedelta(seconds=5))
        assert a.still_leader(T0 + timedelta(seconds=14))
        # A rival's write in between is a conflict that ends leadership.
        b = LeaderElector(k8s_api, k8s_settings, identity="healer-b")
        assert not b.try_acquire_or_renew(T0 + timedelta(seconds=20))  # b sees a's lease at 20

        def rival_then_conflict(*args: Any, **kwargs: Any) -> Any:
            a.api.replace_namespaced_lease = real  # type: ignore[method-assign]
            assert b.try_acquire_or_renew(T0 + timedelta(seconds=40))  # b waited out the lease
            raise ApiException(status=409, reason="Conflict")

        a.api.replace_namespaced_lease = rival_then_conflict  # type: ignore[method-assign]
        assert not a.try_acquire_or_renew(T0 + timedelta(seconds=6))

    @pytest.mark.parametrize("skew", [75, -90])
    def test_a_skewed_standby_neither_steals_nor_waits_longer(
        self,
        emulator: KubernetesEmulator,
        k8s_api: ApiClient,
        k8s_settings: KubernetesSettings,
        skew: int,
    ) -> None:
        """Issue 24: a standby whose clock ran 75 s ahead took the Lease from a leader renewing
        every second. The standby times the Lease's changes on its own clock (client-go), so
        neither an offset ahead nor one behind moves the takeover: 15 s after the last change."""
        a = LeaderElector(k8s_api, k8s_settings, identity="healer-a")
        b = LeaderElector(k8s_api, k8s_settings, identity="healer-b")
        offset = timedelta(seconds=skew)
        for second in range(30):
            assert a.try_acquire_or_renew(T0 + timedelta(seconds=second)), second
            b_now = T0 + offset + timedelta(seconds=second + 0.5)
            assert not b.try_acquire_or_renew(b_now), f"b took over at {second} s"
            assert a.still_leader(T0 + timedelta(seconds=second + 0.5))
        # a's last renewal (at 29) was seen by b at 29.5 on its clock: a takeover needs 15 s more
        assert not b.try_acquire_or_renew(T0 + offset + timedelta(seconds=44))
        assert not a.still_leader(T0 + timedelta(seconds=39))  # long stopped acting by then
        assert b.try_acquire_or_renew(T0 + offset + timedelta(seconds=44.5))
        assert b.fencing_token == a.fencing_token + 1

    def test_a_failed_renewal_keeps_leading_until_the_renew_deadline(
        self, emulator: KubernetesEmulator, k8s_api: ApiClient, k8s_settings: KubernetesSettings
    ) -> None:
        """client-go's leader retries its renewal until its deadline; one failure is not a loss
        (issue 12: dropping leadership on one failed renewal). Past the deadline it is."""
        a = LeaderElector(k8s_api, k8s_settings, identity="healer-a")
        b = LeaderElector(k8s_api, k8s_settings, identity="healer-b")
        assert a.try_acquire_or_renew(T0)
        emulator.inject_error("PUT", r"/leases/healer-leader$", 500)
        assert a.try_acquire_or_renew(T0 + timedelta(seconds=5))  # one failure: still leading
        assert a.try_acquire_or_renew(T0 + timedelta(seconds=8))  # renewed again
        assert not b.try_acquire_or_renew(T0 + timedelta(seconds=9))  # b sees that renewal at 9
        emulator.inject_error("PUT", r"/leases/healer-leader$", 500, times=2)
        assert a.try_acquire_or_renew(T0 + timedelta(seconds=17))  # renewed at 8: leads until 18
        assert not a.try_acquire_or_renew(T0 + timedelta(seconds=18))  # API down past the deadline
        assert not a.still_leader(T0 + timedelta(seconds=18))
        assert not b.try_acquire_or_renew(T0 + timedelta(seconds=23))  # 14 s since the change seen
        assert b.try_acquire_or_renew(T0 + timedelta(seconds=24))
        assert b.fencing_token > a.fencing_token >= 0


# --- dry-run -----------------------------------------------------------------------------------


class TestDryRun:
    def test_dry_run_records_intended_actions_and_changes_nothing(
        self,
        emulator: KubernetesEmulator,
        actions: KubernetesNodeActions,
        session_factory: sessionmaker[Session],
    ) -> None:
        emulator.load(_workload())
        with transaction(session_factory) as s:
            row = get_or_create_node(s, NODE, now=T0)
            incident_id = ensure_incident(s, row, now=T0, summary="Xid 79").id
        rv = node_obj(emulator)["metadata"]["resourceVersion"]
        dry: NodeActions = RecordingNodeActions(actions, session_factory, clock=lambda: T0)

        assert dry.read_node(NODE).name == NODE
        dry.cordon(NODE, Ownership(incident_id=incident_id, reason="Xid 79", at=T0))
        dry.taint(NODE, value="xid", effect="NoSchedule")
        dry.set_condition(NODE, healthy=False, reason="Xid", message="Xid 79", now=T0)
        dry.event(NODE, reason="HealerQuarantined", message="Xid 79")
        report = drain(dry)
        dry.release(NODE)

        assert node_obj(emulator)["metadata"]["resourceVersion"] == rv
        assert not emulator.evictions
        assert not [r for r in emulator.requests if r[0] != "GET"]
        assert report.dry_run and report.done
        assert report.evicted == ("default/web-1", "default/web-2", "training/train-0")
        with session_factory() as s:
            rows = list(s.scalars(select(Action).order_by(Action.id)))
        assert [r.kind for r in rows] == ["cordon", "taint", "condition", "event", "drain", "release"]
        assert {r.status for r in rows} == {"dry_run"}
        assert all(r.target == NODE and r.incident_id == incident_id for r in rows)
        assert rows[4].detail is not None and rows[4].detail["would_evict"] == list(report.evicted)


# --- client configuration ----------------------------------------------------------------------


class TestApiClient:
    def test_kubeconfig_with_context(self, emulator: KubernetesEmulator, tmp_path: Path) -> None:
        emulator.add(node(NODE))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "emu", "cluster": {"server": emulator.host}},
                        {"name": "elsewhere", "cluster": {"server": "http://127.0.0.1:9"}},
                    ],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [
                        {"name": "other", "context": {"cluster": "elsewhere", "user": "u"}},
                        {"name": "emu", "context": {"cluster": "emu", "user": "u"}},
                    ],
                    "current-context": "other",
                }
            )
        )
        settings = KubernetesSettings(kubeconfig=kubeconfig, context="emu", request_timeout_seconds=5)
        with make_api_client(settings) as api:
            assert KubernetesNodeActions(api, settings).read_node(NODE).name == NODE

    def test_the_emulators_own_kubeconfig(self, emulator: KubernetesEmulator, tmp_path: Path) -> None:
        emulator.add(node(NODE))
        settings = KubernetesSettings(kubeconfig=emulator.write_kubeconfig(tmp_path / "kubeconfig"))
        with make_api_client(settings) as api:
            assert KubernetesNodeActions(api, settings).read_node(NODE).unschedulable is False

    def test_a_burst_of_cordons_in_flight_keeps_its_connections(
        self, emulator: KubernetesEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """As many requests at once as a wave's cordons in flight (24) plus the three watches:
        every connection goes back to the pool for the next request. With the official client's
        default (5 per CPU) urllib3 would drop the ones over it and open new ones, warning."""
        names = [f"burst-{i:02d}" for i in range(27)]
        for name in names:
            emulator.add(node(name))
        settings = KubernetesSettings(kubeconfig=emulator.write_kubeconfig(tmp_path / "kubeconfig"))
        with make_api_client(settings) as api, caplog.at_level(logging.WARNING, logger="urllib3"):
            actions = KubernetesNodeActions(api, settings)
            barrier = threading.Barrier(len(names))

            def read(name: str) -> str:
                barrier.wait(timeout=10)  # all 27 requests in flight together
                return actions.read_node(name).name

            for _ in range(2):
                with ThreadPoolExecutor(max_workers=len(names)) as pool:
                    assert sorted(pool.map(read, names)) == names
        assert not [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]

    def test_missing_kubeconfig_is_a_config_error(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="nope"):
            make_api_client(KubernetesSettings(kubeconfig=tmp_path / "nope"))


class TestFleetScenario:
    def test_a_64_node_fleet_drains_one_node_like_kubectl(self, k8s_settings: KubernetesSettings) -> None:
        """The demo's scenario: DaemonSet and mirror pods stay, the Job worker's emptyDir needs
        delete_emptydir_data, the inference replica passes its budget and is rescheduled."""
        with KubernetesEmulator(auto_reschedule=True) as emu:
            emu.load(gpu_fleet(64))
            target = "gpu-node-07"
            with emu.api_client() as api:
                actions = KubernetesNodeActions(api, k8s_settings)
                assert len(emu.list("Node")) == 64
                actions.cordon(target, OWNERSHIP)
                options = DrainOptions(
                    timeout_seconds=600,
                    grace_period_seconds=30,
                    ignore_daemonsets=True,
                    force=False,
                    delete_after_timeout=False,
                    concurrency=8,
                )
                strict = replace(options, delete_emptydir_data=False)
                refused = actions.drain_step(target, started_at=T0, now=T0, options=strict)
                assert refused.refused.keys() == {"training/train-worker-7"}
                lenient = replace(options, delete_emptydir_data=True)
                report = actions.drain_step(target, started_at=T0, now=T0, options=lenient)
            assert report.done
            assert report.evicted == ("inference/inference-7", "training/train-worker-7")
            assert sorted(emu.pods_on(target)) == [
                "kube-system/kube-proxy-gpu-node-07",
                "monitoring/dcgm-exporter-gpu-node-07",
                "monitoring/node-exporter-gpu-node-07",
            ]
            inference = [p for p in emu.list("Pod", "inference") if p["status"]["phase"] == "Running"]
            assert len(inference) == 64  # the evicted replica runs elsewhere
