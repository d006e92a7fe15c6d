"""The emulator's patch and selector semantics (pure functions), against the documented rules."""

from __future__ import annotations

import pytest

from healer_dev.k8s_emulator import (
    ApiError,
    json_merge_patch,
    json_patch,
    match_field_selector,
    match_label_selector,
    match_label_selector_string,
    strategic_merge_patch,
)

NODE = {
    "metadata": {"name": "n", "annotations": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {"taints": [{"key": "t1", "effect": "NoSchedule"}, {"key": "t2", "effect": "NoExecute"}]},
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "GpuHealthy", "status": "True", "reason": "Ok"},
        ]
    },
}


def test_strategic_merge_conditions_by_type() -> None:
    out = strategic_merge_patch(NODE, {"status": {"conditions": [{"type": "GpuHealthy", "status": "False"}]}})
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "GpuHealthy", "status": "False", "reason": "Ok"},
    ]


def test_strategic_merge_delete_directive_and_null() -> None:
    out = strategic_merge_patch(
        NODE,
        {
            "metadata": {"annotations": {"a": None}},
            "status": {"conditions": [{"type": "GpuHealthy", "$patch": "delete"}]},
        },
    )
    assert out["metadata"]["annotations"] == {"b": "2"}
    assert out["status"]["conditions"] == [{"type": "Ready", "status": "True"}]


def test_strategic_merge_taints_are_atomic() -> None:
    out = strategic_merge_patch(NODE, {"spec": {"taints": [{"key": "t3", "effect": "NoSchedule"}]}})
    assert out["spec"]["taints"] == [{"key": "t3", "effect": "NoSchedule"}]


def test_strategic_merge_primitive_set_and_delete_from_primitive_list() -> None:
    out = strategic_merge_patch(NODE, {"metadata": {"finalizers": ["y", "x"]}})
    assert out["metadata"]["finalizers"] == ["x", "y"]
    out = strategic_merge_patch(out, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}})
    assert out["metadata"]["finalizers"] == ["y"]


def test_strategic_merge_replace_directive() -> None:
    out = strategic_merge_patch(NODE, {"metadata": {"annotations": {"$patch": "replace", "c": "3"}}})
    assert out["metadata"]["annotations"] == {"c": "3"}


def test_json_merge_patch_replaces_lists() -> None:
    out = json_merge_patch(NODE, {"status": {"conditions": [{"type": "X", "status": "True"}]}})
    assert out["status"]["conditions"] == [{"type": "X", "status": "True"}]
    assert NODE["status"]["conditions"][0]["type"] == "Ready"  # input untouched


def test_json_patch_ops() -> None:
    out = json_patch(
        NODE,
        [
            {"op": "add", "path": "/metadata/annotations/healer.dev~1x", "value": "y"},
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "replace", "path": "/metadata/annotations/a", "value": "9"},
            {"op": "test", "path": "/metadata/name", "value": "n"},
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "t9", "effect": "NoSchedule"}},
        ],
    )
    assert out["metadata"]["annotations"] == {"a": "9", "b": "2", "healer.dev/x": "y"}
    assert [t["key"] for t in out["spec"]["taints"]] == ["t2", "t9"]
    with pytest.raises(ApiError) as failed:
        json_patch(NODE, [{"op": "test", "path": "/metadata/name", "value": "other"}])
    assert failed.value.code == 422


def test_field_selector() -> None:
    podobj = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "gpu-1"}, "status": {}}
    assert match_field_selector(podobj, "spec.nodeName=gpu-1")
    assert match_field_selector(podobj, "spec.nodeName==gpu-1,metadata.namespace=ns")
    assert not match_field_selector(podobj, "spec.nodeName=gpu-2")
    assert match_field_selector(podobj, "spec.nodeName!=gpu-2")
    assert match_field_selector(podobj, "status.phase!=Running")


def test_label_selectors() -> None:
    labels = {"app": "web", "tier": "front"}
    assert match_label_selector_string(labels, "app=web,tier in (front, back)")
    assert not match_label_selector_string(labels, "app=web,tier notin (front)")
    assert match_label_selector_string(labels, "app,!zone")
    assert not match_label_selector_string(labels, "app!=web")
    assert match_label_selector(labels, {})
    assert not match_label_selector(labels, None)
    assert match_label_selector(labels, {"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]})
