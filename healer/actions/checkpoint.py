"""Checkpoint before eviction: ask a training pod to checkpoint, wait for its answer, then evict.

Who is asked: with the rule's ``drain: {checkpoint: 10m}``, every pod the drain would evict that
requests GPUs (``nvidia.com/gpu`` in a container's limits or requests); and, whatever the rule,
every pod to evict labelled ``<domain>/checkpoint: "true"`` (the job opts in; its wait is the
rule's ``checkpoint`` or ``kubernetes.checkpoint_timeout_seconds``).

The conversation, in pod annotations (``<domain>`` is ``healer.dev`` by default)::

    healer writes   <domain>/checkpoint-requested-at: 2026-12-01T12:00:00Z   (RFC 3339, UTC)
                    <domain>/checkpoint-deadline:     2026-12-01T12:10:00Z   (evicted then at the latest)
                    <domain>/checkpoint-incident:     "42"                   (the node's incident)
    the job writes  <domain>/checkpoint-done-at:      2026-12-01T12:03:10Z   (its checkpoint is saved)

A job reads the request through the downward API (a ``metadata.annotations`` volume, refreshed by
the kubelet) and answers with a patch of its own pod (docs/job-aware.md has a PyTorch example).
The pod is evicted as soon as it answered, or at the deadline if it never does. An answer older
than the request (a previous incident's) does not count, and a new request removes it.

Stateless like the drain: the request time lives on the pod, so a restarted controller waits for
the same deadline. Each drain step reports, per pod asked, the request time and the answer time
(or that the deadline passed): the drain's record keeps both.

The eviction itself adds nothing for the job's ``podFailurePolicy``: kube-apiserver's Eviction API
already sets the pod condition ``DisruptionTarget`` (reason ``EvictionByEvictionAPI``) before it
deletes the pod (``pkg/registry/core/pod/storage/eviction.go``; GA since 1.31), so a Job rule
``onPodConditions: [{type: DisruptionTarget}]`` with ``action: Ignore`` does not count it as a failure.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from kubernetes import client as k8s

from healer.actions.apierrors import api_call
from healer.errors import KubernetesError, KubernetesNotFound

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class CheckpointKeys:
    """The label and annotation keys of the conversation, under ``<domain>/``."""

    label: str
    requested: str
    deadline: str
    incident: str
    done: str

    @classmethod
    def for_domain(cls, domain: str) -> CheckpointKeys:
        return cls(
            label=f"{domain}/checkpoint",
            requested=f"{domain}/checkpoint-requested-at",
            deadline=f"{domain}/checkpoint-deadline",
            incident=f"{domain}/checkpoint-incident",
            done=f"{domain}/checkpoint-done-at",
        )


@dataclass
class Gate:
    """Pods the drain may evict now (``ready``), pods still checkpointing (``waiting``, as
    ``namespace/name``), and per pod asked: ``requested_at``, ``deadline``, and ``acknowledged_at``
    or ``deadline_passed_at`` (RFC 3339 UTC)."""

    ready: list[k8s.V1Pod] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    times: dict[str, dict[str, str]] = field(default_factory=dict)


def _utc(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _meta(pod: k8s.V1Pod) -> k8s.V1ObjectMeta:
    meta = pod.metadata
    if meta is None:
        raise ValueError("pod without metadata")
    return meta


def requests_gpus(pod: k8s.V1Pod) -> bool:
    """A container of the pod asks for ``nvidia.com/gpu`` (limits or requests)."""
    for c in (pod.spec.containers if pod.spec else None) or []:
        res = c.resources
        if res is not None and (GPU_RESOURCE in (res.limits or {}) or GPU_RESOURCE in (res.requests or {})):
            return True
    return False


def wait_seconds(pod: k8s.V1Pod, *, rule_seconds: float, label_seconds: float, keys: CheckpointKeys) -> float:
    """How long to wait for this pod's checkpoint (seconds; 0 = not asked). Pure."""
    labelled = ((pod.metadata.labels if pod.metadata else None) or {}).get(keys.label, "").lower() == "true"
    if rule_seconds > 0 and (labelled or requests_gpus(pod)):
        return rule_seconds
    return (rule_seconds or label_seconds) if labelled else 0.0


def gate(
    core: k8s.CoreV1Api,
    pods: Sequence[k8s.V1Pod],
    *,
    incident: int | None,
    now: datetime,
    rule_seconds: float,
    label_seconds: float,
    keys: CheckpointKeys,
    request_timeout: float,
    ask: bool = True,
    latest: datetime | None = None,
) -> Gate:
    """Sort ``pods`` (all to be evicted) into ready and waiting; ask the pods not asked yet
    (one merge patch each; ``ask=False`` for a plan that writes nothing). No deadline is later
    than ``latest`` (the drain's own deadline).

    Raises nothing for one pod: a pod gone (404) is ready (the eviction will find it gone); a pod
    whose patch fails for another reason waits for the next step (logged).
    """
    out = Gate()
    for pod in pods:
        seconds = wait_seconds(pod, rule_seconds=rule_seconds, label_seconds=label_seconds, keys=keys)
        if seconds <= 0:
            out.ready.append(pod)
            continue
        meta = _meta(pod)
        key = f"{meta.namespace}/{meta.name}"
        annotations = meta.annotations or {}
        requested = _parse(annotations.get(keys.requested))
        same = requested is not None and annotations.get(keys.incident, "") == str(incident or "")
        if not same:
            deadline = now + timedelta(seconds=seconds)
            deadline = min(deadline, latest) if latest is not None else deadline
            out.times[key] = {"requested_at": _utc(now), "deadline": _utc(deadline)}
            if deadline <= now:  # the drain's own deadline has passed (or a request kept failing)
                out.times[key]["deadline_passed_at"] = _utc(deadline)
                out.ready.append(pod)
                continue
            if ask:
                try:
                    _ask(
                        core,
                        pod,
                        now=now,
                        deadline=deadline,
                        incident=incident,
                        keys=keys,
                        timeout=request_timeout,
                    )
                except KubernetesNotFound:
                    out.ready.append(pod)
                    continue
                except KubernetesError as exc:
                    log.warning("checkpoint request to %s failed (retried next step): %s", key, exc)
            out.waiting.append(key)
            continue
        assert requested is not None
        deadline = _parse(annotations.get(keys.deadline)) or requested + timedelta(seconds=seconds)
        times = {"requested_at": _utc(requested), "deadline": _utc(deadline)}
        done_raw = annotations.get(keys.done)
        done = _parse(done_raw)
        if done_raw and (done is None or done >= requested):
            times["acknowledged_at"] = _utc(done or now)
            out.ready.append(pod)
        elif now >= deadline:
            times["deadline_passed_at"] = _utc(deadline)
            out.ready.append(pod)
        else:
            out.waiting.append(key)
        out.times[key] = times
    return out


def _ask(
    core: k8s.CoreV1Api,
    pod: k8s.V1Pod,
    *,
    now: datetime,
    deadline: datetime,
    incident: int | None,
    keys: CheckpointKeys,
    timeout: float,
) -> None:
    """One merge patch: the request, its deadline and incident; a previous answer removed."""
    meta = _meta(pod)
    body = {
        "metadata": {
            "annotations": {
                keys.requested: _utc(now),
                keys.deadline: _utc(deadline),
                keys.incident: str(incident or ""),
                keys.done: None,
            }
        }
    }
    with api_call(f"request a checkpoint from pod {meta.namespace}/{meta.name}"):
        core.patch_namespaced_pod(
            str(meta.name),
            str(meta.namespace),
            body,
            _content_type="application/merge-patch+json",
            _request_timeout=timeout,
        )
    log.info("asked pod %s/%s to checkpoint by %s", meta.namespace, meta.name, _utc(deadline))
