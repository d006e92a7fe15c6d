"""Pods and eviction: PodDisruptionBudget status, scheduling, termination, the Eviction API.

What the disruption controller, the scheduler, the kubelet and ``pkg/registry/core/pod/storage/
eviction.go`` would do, done at once under the store's lock.
"""

from __future__ import annotations

import copy
import math
import secrets
import time
from datetime import UTC, datetime, timedelta

from healer_dev.k8s_emulator.resources import _BY_PATH, ApiError, Obj, Resource, _not_found, _now_iso
from healer_dev.k8s_emulator.selectors import match_label_selector
from healer_dev.k8s_emulator.state import EmulatorState, Eviction


class PodLifecycle(EmulatorState):
    """Computed PDB status, scheduling and running created pods, graceful deletion, evictions."""

    def _with_status(self, res: Resource, obj: Obj) -> Obj:
        if res.kind == "PodDisruptionBudget":
            status = self._pdb_status(obj)
            old = obj.get("status") or {}
            if any(old.get(k) != status[k] for k in _PDB_COUNTS):
                # The disruption controller writes a changed status: a new resourceVersion, which
                # a watch from an older one reports as MODIFIED.
                obj["status"] = status
                obj["metadata"]["resourceVersion"] = self._next_rv()
        return obj

    def _pdb_status(self, pdb: Obj) -> Obj:
        ns = pdb["metadata"]["namespace"]
        selector = pdb["spec"].get("selector")
        matching = [
            p
            for (pns, _), p in self._store[("v1", "pods")].items()
            if pns == ns
            and match_label_selector(p["metadata"].get("labels") or {}, selector)
            and not p["metadata"].get("deletionTimestamp")
        ]
        ghosts = [
            g
            for g in self._ghosts
            if g["metadata"]["namespace"] == ns
            and match_label_selector(g["metadata"].get("labels") or {}, selector)
        ]
        expected = len(matching) + len(ghosts)
        healthy = sum(1 for p in matching if _pod_ready(p))
        spec = pdb["spec"]
        if spec.get("maxUnavailable") is not None:
            desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
        elif spec.get("minAvailable") is not None:
            desired = _scaled(spec["minAvailable"], expected)
        else:
            desired = 1  # neither set: the old policy/v1beta1 default of minAvailable 1
        return {
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "expectedPods": expected,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "disruptionsAllowed": max(0, healthy - desired),
            "conditions": [
                {
                    "type": "DisruptionAllowed",
                    "status": "True" if healthy > desired else "False",
                    "reason": "SufficientPods" if healthy > desired else "InsufficientPods",
                    "message": "",
                    "lastTransitionTime": _now_iso(),
                    "observedGeneration": 1,
                }
            ],
        }

    def _schedule_and_run(self, obj: Obj) -> None:
        """What the scheduler and the kubelet would do, at once: bind to the first schedulable
        node (by name) when unbound, then report Running and Ready."""
        spec = obj.setdefault("spec", {})
        if not spec.get("nodeName"):
            schedulable = sorted(
                n["metadata"]["name"]
                for n in self._store[("v1", "nodes")].values()
                if not n.get("spec", {}).get("unschedulable")
            )
            if not schedulable:
                return
            spec["nodeName"] = schedulable[0]
        obj["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "startTime": _now_iso(),
        }

    def _recreate(self, ghost: Obj, node_name: str) -> str:
        fresh = copy.deepcopy(ghost)
        meta = fresh["metadata"]
        base = meta["name"].rsplit("-", 1)[0] if "-" in meta["name"] else meta["name"]
        meta["name"] = f"{base}-{secrets.token_hex(3)[:5]}"
        for k in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(k, None)
        fresh["spec"]["nodeName"] = node_name
        fresh["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        self.add(fresh)
        return f"{meta['namespace']}/{meta['name']}"

    def _delete_pod(self, obj: Obj, grace: int | None) -> Obj:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if grace is None or grace < 0:
            grace = int(obj["spec"].get("terminationGracePeriodSeconds", 30))
        if self.terminating_seconds > 0 and grace > 0 and obj["status"].get("phase") == "Running":
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = (
                    datetime.now(UTC) + timedelta(seconds=grace)
                ).strftime("%Y-%m-%dT%H:%M:%SZ")
                obj["metadata"]["deletionGracePeriodSeconds"] = grace
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self._terminating[key] = time.monotonic() + min(grace, self.terminating_seconds)
            return copy.deepcopy(obj)
        self._store[("v1", "pods")].pop(key, None)
        self._next_rv()
        return copy.deepcopy(obj)

    def _controller_owned(self, obj: Obj) -> bool:
        return any(
            ref.get("controller") and ref.get("kind") in ("ReplicaSet", "StatefulSet", "Job")
            for ref in obj["metadata"].get("ownerReferences") or []
        )

    def _evict(self, ns: str, name: str, body: Obj) -> tuple[int, Obj]:
        pods = self._store[("v1", "pods")]
        res = _BY_PATH[("v1", "pods")]
        obj = pods.get((ns, name))
        if obj is None:
            self.evictions.append(Eviction(f"{ns}/{name}", "", 404))
            raise _not_found(res, name)
        options = body.get("deleteOptions") or {}
        want_uid = (options.get("preconditions") or {}).get("uid")
        if want_uid and want_uid != obj["metadata"]["uid"]:
            self.evictions.append(Eviction(f"{ns}/{name}", obj["metadata"]["uid"], 409))
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: "
                f"{obj['metadata']['uid']}",
                {"name": name, "kind": "pods"},
            )
        terminating = bool(obj["metadata"].get("deletionTimestamp"))
        running = obj["status"].get("phase") == "Running"
        pdbs: list[Obj] = []
        if running and not terminating:
            pdbs = [
                p
                for (pns, _), p in self._store[("policy/v1", "poddisruptionbudgets")].items()
                if pns == ns
                and match_label_selector(obj["metadata"].get("labels") or {}, p["spec"].get("selector"))
            ]
            if len(pdbs) > 1:
                self.evictions.append(Eviction(f"{ns}/{name}", obj["metadata"]["uid"], 500))
                raise ApiError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                    "does not support.",
                )
            if pdbs:
                status = self._pdb_status(pdbs[0])
                if status["disruptionsAllowed"] <= 0 or not _pod_ready(obj):
                    budget = pdbs[0]["metadata"]["name"]
                    self.evictions.append(Eviction(f"{ns}/{name}", obj["metadata"]["uid"], 429))
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {budget} needs "
                                    f"{status['desiredHealthy']} healthy pods and has "
                                    f"{status['currentHealthy']} currently",
                                }
                            ]
                        },
                    )
        grace = options.get("gracePeriodSeconds")
        self._delete_pod(obj, grace)
        if running and not terminating and self._controller_owned(obj):
            others = [
                n["metadata"]["name"]
                for n in self._store[("v1", "nodes")].values()
                if not n["spec"].get("unschedulable") and n["metadata"]["name"] != obj["spec"].get("nodeName")
            ]
            if self.auto_reschedule and others:
                self._recreate(obj, sorted(others)[0])
            else:
                self._ghosts.append(copy.deepcopy(obj))
        if running and not terminating and pdbs:
            # The Eviction API writes the budget's status as it admits the eviction (one
            # disruption fewer allowed): a watch sees that change before the replacement's.
            self._with_status(_BY_PATH[("policy/v1", "poddisruptionbudgets")], pdbs[0])
        self.evictions.append(Eviction(f"{ns}/{name}", obj["metadata"]["uid"], 201))
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


_PDB_COUNTS = ("expectedPods", "currentHealthy", "desiredHealthy", "disruptionsAllowed")


def _scaled(value: int | str, total: int) -> int:
    """An int, or a percentage of ``total`` rounded up (the disruption controller rounds up)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)


def _pod_ready(obj: Obj) -> bool:
    if obj["status"].get("phase") != "Running" or obj["metadata"].get("deletionTimestamp"):
        return False
    conds = {c.get("type"): c.get("status") for c in obj["status"].get("conditions") or []}
    return conds.get("Ready", "True") == "True"
