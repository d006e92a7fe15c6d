"""The validation Job before a node returns: create it on the node, read its outcome, delete it.

The Job's pod is pinned with ``nodeName`` (the scheduler is bypassed, so healer's cordon does not
keep it off), tolerates healer's taint, and requests all the node's GPUs (allocatable
``nvidia.com/gpu``), so nothing else runs beside it. ``backoffLimit: 0`` (one try),
``activeDeadlineSeconds`` from the settings, ``ttlSecondsAfterFinished`` as a fallback clean-up;
healer deletes it once the result is recorded.

The outcome is read from the pod (``status.phase`` and the container's
``state.terminated.exitCode``/``message``: ``terminationMessagePolicy: FallbackToLogsOnError``)
and judged by :func:`healer.model.validation.judge`; a Job failed without a finished pod
(deadline exceeded) is failed with the Job's reason. RBAC: ``batch/jobs`` create, get, delete
in the validation namespace (the chart's Role when ``validation.enabled``); pods list, which
healer already has for drains.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from kubernetes import client as k8s

from healer.actions.apierrors import api_call
from healer.config import KubernetesSettings, ValidationSettings
from healer.errors import KubernetesConflict, KubernetesNotFound
from healer.model.node import NodeView
from healer.model.validation import ValidationResult, judge

log = logging.getLogger(__name__)


class Validator(Protocol):
    """What the controller runs validation Jobs through: :class:`ValidationJobs`, or in dry-run
    :class:`healer.actions.validation_dryrun.RecordedValidationJobs`."""

    def start(self, view: NodeView, job: str, incident: int) -> None: ...

    def result(self, job: str) -> ValidationResult: ...

    def delete(self, job: str) -> None: ...


class ValidationJobs:
    """Validation Jobs in ``settings.namespace`` (``api_client`` as healer's ServiceAccount)."""

    def __init__(
        self, api_client: k8s.ApiClient, settings: ValidationSettings, kube: KubernetesSettings
    ) -> None:
        self.settings = settings
        self.domain = kube.domain
        self.batch = k8s.BatchV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self._timeout = kube.request_timeout_seconds
        self.label = f"{kube.domain}/validation-job"

    def body(self, view: NodeView, job: str, incident: int) -> dict[str, Any]:
        """The Job for ``view`` (see the module docstring)."""
        s = self.settings
        level = str(s.dcgm_level)
        command = [part.replace("{level}", level) for part in s.command]
        limits = {s.gpu_resource: str(view.gpus)} if view.gpus else {}
        labels = {"app.kubernetes.io/managed-by": "healer", self.label: job}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job,
                "namespace": s.namespace,
                "labels": labels,
                "annotations": {f"{self.domain}/incident": str(incident), f"{self.domain}/node": view.name},
            },
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": s.timeout_seconds,
                "ttlSecondsAfterFinished": 86400,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeName": view.name,
                        "restartPolicy": "Never",
                        "tolerations": [{"key": f"{self.domain}/quarantined", "operator": "Exists"}],
                        "containers": [
                            {
                                "name": "validate",
                                "image": s.image,
                                "command": command,
                                "terminationMessagePolicy": "FallbackToLogsOnError",
                                "resources": {"limits": limits, "requests": limits},
                            }
                        ],
                    },
                },
            },
        }

    def start(self, view: NodeView, job: str, incident: int) -> None:
        """Create the Job (one already there with that name is taken as ours: a retried step)."""
        try:
            with api_call(f"create validation job {job}"):
                body = self.body(view, job, incident)
                self.batch.create_namespaced_job(
                    self.settings.namespace,
                    body,  # type: ignore[arg-type]
                    _request_timeout=self._timeout,
                )
        except KubernetesConflict:
            log.info("validation job %s exists already", job)

    def result(self, job: str) -> ValidationResult:
        """The Job's outcome now (``running`` until its pod has finished)."""
        with api_call(f"list pods of validation job {job}"):
            pods = self.core.list_namespaced_pod(
                self.settings.namespace, label_selector=f"{self.label}={job}", _request_timeout=self._timeout
            ).items
        for pod in pods:
            status = pod.status or k8s.V1PodStatus()
            ended = [c.state.terminated for c in (status.container_statuses or []) if c.state]
            terminated = next((t for t in ended if t is not None), None)
            if status.phase in ("Succeeded", "Failed") or terminated is not None:
                succeeded = 0 if status.phase == "Succeeded" else None
                exit_code = terminated.exit_code if terminated else succeeded
                message = terminated.message if terminated else status.message
                return judge(
                    status.phase, exit_code, message, nccl_min_busbw_gbps=self.settings.nccl_min_busbw_gbps
                )
        try:
            with api_call(f"read validation job {job}"):
                obj = self.batch.read_namespaced_job(
                    job, self.settings.namespace, _request_timeout=self._timeout
                )
        except KubernetesNotFound:
            return ValidationResult("failed", message=f"validation job {job} is gone")
        for cond in (obj.status.conditions if obj.status else None) or []:
            if cond.type == "Failed" and cond.status == "True":
                return ValidationResult("failed", message=f"{cond.reason}: {cond.message or ''}".strip())
        return ValidationResult("running")

    def delete(self, job: str) -> None:
        """Delete the Job and its pod (gone already is fine)."""
        try:
            with api_call(f"delete validation job {job}"):
                self.batch.delete_namespaced_job(
                    job,
                    self.settings.namespace,
                    propagation_policy="Background",
                    _request_timeout=self._timeout,
                )
        except KubernetesNotFound:
            pass
