"""Take one GPU out of service: a DRA ``DeviceTaintRule``, or a node annotation where DRA is not served.

**DRA** (``resource.k8s.io/v1alpha3``, Kubernetes 1.33+ with the ``DRADeviceTaints`` feature gate and
the alpha API enabled): one cluster-scoped DeviceTaintRule per GPU taken out::

    apiVersion: resource.k8s.io/v1alpha3
    kind: DeviceTaintRule
    metadata:
      name: healer-<node>-gpu-<gpu>
      labels: {app.kubernetes.io/managed-by: healer, <domain>/node: <node>, <domain>/gpu: "<gpu>"}
      annotations: {<domain>/rule: <rule>}
    spec:
      deviceSelector: {driver: gpu.nvidia.com, pool: <node>, device: gpu-<gpu>}
      taint: {key: <domain>/unhealthy, value: <rule>, effect: NoSchedule}

The scheduler then allocates no ResourceClaim to that device (``NoExecute`` also evicts the pods
using it); the node and its other GPUs keep serving. Driver, pool and device name follow the NVIDIA
DRA driver's ResourceSlices and are settings (``gpu_isolation``).

**Annotation** (no DRA, e.g. the classic device plugin): the node annotation
``<domain>/gpus-out: "3,5"`` (GPU indexes, sorted). The NVIDIA device plugin does not read it by
itself: a health-check hook or a node agent that marks those devices unhealthy (the plugin then
stops advertising them, and allocatable drops) can, and the Kueue quota sync counts them out.
This is the documented contract, not a claim that the stock plugin honours it.

``current()`` reads what healer has out now (one list call), so the sync is stateless.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol, cast

from kubernetes import client as k8s

from healer.actions.apierrors import api_call
from healer.config import GpuIsolationSettings
from healer.errors import KubernetesError, KubernetesNotFound
from healer.model.states import ActionStatus

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "resource.k8s.io", "v1alpha3", "devicetaintrules"
MANAGED_BY = "app.kubernetes.io/managed-by"
MERGE_PATCH = "application/merge-patch+json"

#: node → GPU index → rule.
GpusOut = dict[str, dict[str, str]]


class IsolationPort(Protocol):
    """What the GPU isolation sync needs (``GpuIsolation`` or ``DryRunGpuIsolation``)."""

    status: ActionStatus

    def mode(self) -> str: ...

    def where(self, node: str, gpu: str) -> str: ...

    def current(self) -> GpusOut: ...

    def isolate(self, node: str, gpu: str, rule: str) -> None: ...

    def restore(self, node: str, gpu: str) -> None: ...


class GpuIsolation:
    """Take GPUs out on a real cluster (see the module docstring)."""

    status = ActionStatus.SUCCEEDED

    def __init__(
        self,
        api_client: k8s.ApiClient,
        settings: GpuIsolationSettings,
        *,
        domain: str,
        request_timeout: float = 10.0,
    ) -> None:
        self.core = k8s.CoreV1Api(api_client)
        self.resource = k8s.ResourceV1alpha3Api(api_client)
        self.settings = settings
        self.domain = domain
        self.annotation = f"{domain}/gpus-out"
        self._timeout = request_timeout
        self._mode: str | None = None if settings.mode == "auto" else settings.mode

    def mode(self) -> str:
        """``dra`` when the cluster serves DeviceTaintRules (discovered once), else ``annotation``."""
        if self._mode is None:
            try:
                with api_call(f"discover {GROUP}/{VERSION}"):
                    found = self.resource.get_api_resources(_request_timeout=self._timeout)
                served = any(r.name == PLURAL for r in found.resources or [])
            except KubernetesNotFound:
                served = False
            self._mode = "dra" if served else "annotation"
            log.info(
                "GPU isolation: %s",
                "DRA DeviceTaintRules" if served else f"node annotation {self.annotation}",
            )
        return self._mode

    def name(self, node: str, gpu: str) -> str:
        return f"healer-{node}-gpu-{gpu}"[:253]

    def where(self, node: str, gpu: str) -> str:
        """What marks GPU ``gpu`` of ``node`` out, for people: the DeviceTaintRule or the annotation."""
        if self.mode() == "dra":
            return f"DeviceTaintRule {self.name(node, gpu)}"
        return f"node annotation {self.annotation}"

    def current(self) -> GpusOut:
        out: GpusOut = {}
        if self.mode() == "dra":
            with api_call("list DeviceTaintRules"):
                rules = self.resource.list_device_taint_rule(
                    label_selector=f"{MANAGED_BY}=healer", _request_timeout=self._timeout
                )
            for r in rules.items or []:
                labels = (r.metadata.labels if r.metadata else None) or {}
                annotations = (r.metadata.annotations if r.metadata else None) or {}
                node, gpu = labels.get(f"{self.domain}/node"), labels.get(f"{self.domain}/gpu")
                if node and gpu:
                    out.setdefault(node, {})[gpu] = annotations.get(f"{self.domain}/rule", "")
            return out
        with api_call("list nodes"):
            nodes = self.core.list_node(_request_timeout=self._timeout)
        for n in nodes.items or []:
            value = ((n.metadata.annotations if n.metadata else None) or {}).get(self.annotation, "")
            gpus = [g for g in value.split(",") if g]
            if gpus and n.metadata and n.metadata.name:
                out[n.metadata.name] = dict.fromkeys(gpus, "")
        return out

    def isolate(self, node: str, gpu: str, rule: str) -> None:
        """Take GPU ``gpu`` of ``node`` out (idempotent: an existing rule or index is left as is)."""
        if self.mode() == "annotation":
            self._annotate(node, add=gpu)
            return
        s = self.settings
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": self.name(node, gpu),
                "labels": {MANAGED_BY: "healer", f"{self.domain}/node": node, f"{self.domain}/gpu": gpu},
                "annotations": {f"{self.domain}/rule": rule},
            },
            "spec": {
                "deviceSelector": {
                    "driver": s.driver,
                    "pool": s.pool.format(node=node, gpu=gpu),
                    "device": s.device_name.format(node=node, gpu=gpu),
                },
                "taint": {"key": f"{self.domain}/unhealthy", "value": rule, "effect": s.effect},
            },
        }
        try:
            with api_call(f"create DeviceTaintRule for GPU {gpu} of node {node}"):
                self.resource.create_device_taint_rule(body, _request_timeout=self._timeout)  # type: ignore[arg-type]
        except KubernetesError as exc:
            if exc.status != 409:  # already there: done
                raise

    def restore(self, node: str, gpu: str) -> None:
        """Give GPU ``gpu`` of ``node`` back (idempotent)."""
        if self.mode() == "annotation":
            self._annotate(node, remove=gpu)
            return
        try:
            with api_call(f"delete DeviceTaintRule for GPU {gpu} of node {node}"):
                self.resource.delete_device_taint_rule(self.name(node, gpu), _request_timeout=self._timeout)
        except KubernetesNotFound:
            pass

    def _annotate(self, node: str, *, add: str | None = None, remove: str | None = None) -> None:
        with api_call(f"read node {node}"):
            got = self.core.read_node(node, _request_timeout=self._timeout)
        annotations = cast(Mapping[str, str], (got.metadata.annotations if got.metadata else None) or {})
        gpus = {g for g in annotations.get(self.annotation, "").split(",") if g}
        wanted = (gpus | {add} if add else gpus) - ({remove} if remove else set())
        if wanted == gpus:
            return
        value = ",".join(sorted(wanted, key=lambda g: (len(g), g))) or None
        body = {"metadata": {"annotations": {self.annotation: value}}}
        with api_call(f"annotate node {node} ({self.annotation})"):
            self.core.patch_node(node, body, _content_type=MERGE_PATCH, _request_timeout=self._timeout)


class DryRunGpuIsolation:
    """Reads the mode through ``real``; takes nothing out and remembers what it would have, which
    :meth:`current` shows (so each change is recorded once)."""

    status = ActionStatus.DRY_RUN

    def __init__(self, real: GpuIsolation) -> None:
        self.real = real
        self.would: GpusOut = {}

    def mode(self) -> str:
        return self.real.mode()

    def where(self, node: str, gpu: str) -> str:
        return self.real.where(node, gpu)

    def current(self) -> GpusOut:
        return {node: dict(gpus) for node, gpus in self.would.items() if gpus}

    def isolate(self, node: str, gpu: str, rule: str) -> None:
        self.would.setdefault(node, {})[gpu] = rule

    def restore(self, node: str, gpu: str) -> None:
        self.would.get(node, {}).pop(gpu, None)
