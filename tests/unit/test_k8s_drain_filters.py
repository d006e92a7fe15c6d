"""kubectl drain's pod filters (healer.actions.drain.decide/classify): pure, table-driven."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from healer.actions.base import NodeView, human_uncordoned, incident_of
from healer.actions.drain import Disposition, DrainOptions, classify, decide, selector_matches
from healer_dev.k8s_emulator import pod


def v1pod(obj: dict[str, Any], *, terminating: bool = False) -> k8s.V1Pod:
    if terminating:
        obj["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    obj["metadata"].setdefault("uid", "u-" + obj["metadata"]["name"])
    return k8s.V1Pod.from_dict(obj)


DEFAULT = DrainOptions()
LENIENT = DrainOptions(delete_emptydir_data=True, force=True)
STRICT = DrainOptions(ignore_daemonsets=False)

CASES = [
    # (id, pod, options, disposition)
    ("replicaset", pod("a", node_name="n"), DEFAULT, Disposition.EVICT),
    ("job", pod("a", node_name="n", owner=("Job", "j")), DEFAULT, Disposition.EVICT),
    ("daemonset-kept", pod("a", node_name="n", owner=("DaemonSet", "d")), DEFAULT, Disposition.KEEP),
    ("daemonset-refused", pod("a", node_name="n", owner=("DaemonSet", "d")), STRICT, Disposition.REFUSE),
    (
        "daemonset-finished-evicted",
        pod("a", node_name="n", owner=("DaemonSet", "d"), phase="Failed"),
        STRICT,
        Disposition.EVICT,
    ),
    ("mirror", pod("a", node_name="n", owner=None, mirror=True), DEFAULT, Disposition.KEEP),
    ("mirror-even-strict", pod("a", node_name="n", owner=None, mirror=True), STRICT, Disposition.KEEP),
    ("emptydir-refused", pod("a", node_name="n", empty_dir=True), DEFAULT, Disposition.REFUSE),
    ("emptydir-allowed", pod("a", node_name="n", empty_dir=True), LENIENT, Disposition.EVICT),
    (
        "emptydir-finished",
        pod("a", node_name="n", empty_dir=True, phase="Succeeded"),
        DEFAULT,
        Disposition.EVICT,
    ),
    ("unmanaged-refused", pod("a", node_name="n", owner=None), DEFAULT, Disposition.REFUSE),
    ("unmanaged-forced", pod("a", node_name="n", owner=None), LENIENT, Disposition.EVICT),
    (
        "unmanaged-finished",
        pod("a", node_name="n", owner=None, phase="Succeeded"),
        DEFAULT,
        Disposition.EVICT,
    ),
]


@pytest.mark.parametrize(("obj", "options", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_filter(obj: dict[str, Any], options: DrainOptions, expected: Disposition) -> None:
    assert decide(v1pod(obj), options).disposition is expected


def test_terminating_pods_are_waited_for_before_any_other_filter() -> None:
    unmanaged = pod("a", node_name="n", owner=None, empty_dir=True)
    assert decide(v1pod(unmanaged, terminating=True), DEFAULT).disposition is Disposition.WAIT


def test_emptydir_is_checked_before_the_controller() -> None:
    both = pod("a", node_name="n", owner=None, empty_dir=True)
    assert "emptyDir" in decide(v1pod(both), DEFAULT).reason


def test_classify_names_every_refused_pod() -> None:
    pods = [
        v1pod(pod("web", node_name="n")),
        v1pod(pod("ds", node_name="n", owner=("DaemonSet", "d"))),
        v1pod(pod("scratch", node_name="n", empty_dir=True)),
        v1pod(pod("debug", node_name="n", owner=None)),
        v1pod(pod("old", node_name="n"), terminating=True),
    ]
    plan = classify(pods, DEFAULT)
    assert [p.metadata.name for p in plan.evict] == ["web"]
    assert plan.kept == ["default/ds"]
    assert plan.waiting == ["default/old"]
    assert set(plan.refused) == {"default/scratch", "default/debug"}


def test_selector_matching() -> None:
    labels = {"app": "web", "tier": "front"}
    expr = k8s.V1LabelSelectorRequirement
    assert selector_matches(k8s.V1LabelSelector(match_labels={"app": "web"}), labels)
    assert not selector_matches(k8s.V1LabelSelector(match_labels={"app": "db"}), labels)
    assert selector_matches(k8s.V1LabelSelector(), labels)  # empty selects all (policy/v1)
    assert not selector_matches(None, labels)
    assert selector_matches(
        k8s.V1LabelSelector(match_expressions=[expr(key="tier", operator="In", values=["front", "x"])]),
        labels,
    )
    assert not selector_matches(
        k8s.V1LabelSelector(match_expressions=[expr(key="tier", operator="NotIn", values=["front"])]), labels
    )
    assert selector_matches(
        k8s.V1LabelSelector(match_expressions=[expr(key="zone", operator="DoesNotExist")]), labels
    )
    assert not selector_matches(
        k8s.V1LabelSelector(match_expressions=[expr(key="zone", operator="Exists")]), labels
    )


@pytest.mark.parametrize(
    ("annotations", "unschedulable", "expected"),
    [
        ({"healer.dev/cordoned-by": "healer"}, False, True),  # healer cordoned, a human uncordoned
        ({"healer.dev/cordoned-by": "healer"}, True, False),  # still healer's cordon
        ({}, False, False),  # never healer's
        ({"healer.dev/incident": "3"}, True, False),  # a human's cordon healer noted
    ],
)
def test_human_uncordoned(annotations: dict[str, str], unschedulable: bool, expected: bool) -> None:
    view = NodeView(name="n", unschedulable=unschedulable, annotations=annotations)
    assert human_uncordoned(view, domain="healer.dev") is expected


def test_incident_of() -> None:
    assert (
        incident_of(NodeView("n", True, annotations={"healer.dev/incident": "17"}), domain="healer.dev") == 17
    )
    assert (
        incident_of(NodeView("n", True, annotations={"healer.dev/incident": "x"}), domain="healer.dev")
        is None
    )
