"""The served resource types, the ``Status`` error answer, and the timestamps objects carry."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class Resource:
    """One served resource type: ``group_version`` as in ``apiVersion``, ``plural`` as in URLs."""

    group_version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False


RESOURCES: tuple[Resource, ...] = (
    Resource("v1", "nodes", "Node", namespaced=False, has_status=True),
    Resource("v1", "namespaces", "Namespace", namespaced=False),
    Resource("v1", "pods", "Pod", namespaced=True, has_status=True),
    Resource("v1", "events", "Event", namespaced=True),
    Resource("events.k8s.io/v1", "events", "Event", namespaced=True),
    Resource("coordination.k8s.io/v1", "leases", "Lease", namespaced=True),
    Resource("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True, has_status=True),
)
_BY_PATH = {(r.group_version, r.plural): r for r in RESOURCES}
_BY_KIND = {(r.group_version, r.kind): r for r in RESOURCES}


class ApiError(Exception):
    """An answer other than success, rendered as a ``Status`` object with ``code``."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def body(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_found(res: Resource, name: str) -> ApiError:
    group = res.group_version.split("/")[0] if "/" in res.group_version else ""
    what = f"{res.plural}.{group}" if group else res.plural
    return ApiError(
        404, "NotFound", f'{what} "{name}" not found', {"name": name, "group": group, "kind": res.plural}
    )


def _conflict(res: Resource, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        {"name": name, "kind": res.plural},
    )
