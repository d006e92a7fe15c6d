"""Request dispatch: REST paths to list, create, get, update (PUT/PATCH, ``/status``), delete and
evict, with the answers (and errors) a real API server gives."""

from __future__ import annotations

import copy
import secrets
import uuid
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from healer_dev.k8s_emulator import server_checks
from healer_dev.k8s_emulator.patches import patched
from healer_dev.k8s_emulator.pods import PodLifecycle
from healer_dev.k8s_emulator.resources import (
    _BY_PATH,
    ApiError,
    Obj,
    Resource,
    _conflict,
    _not_found,
    _now_iso,
)
from healer_dev.k8s_emulator.selectors import match_field_selector, match_label_selector_string
from healer_dev.k8s_emulator.validation import check_field_selector, validate


class WatchRequested(Exception):
    """A ``?watch=true`` list: the HTTP handler streams the events (see ``server._Handler``)."""

    def __init__(self, res: Resource, ns: str | None, query: dict[str, str]) -> None:
        super().__init__(res.plural)
        self.res, self.ns, self.query = res, ns, query


class RestDispatch(PodLifecycle):
    """The API server's request handling (called by the HTTP handler with the lock held)."""

    def handle(self, method: str, raw_path: str, content_type: str, body: Any) -> tuple[int, Obj]:
        self.requests.append((method, raw_path))
        url = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        for inj in self._injected:
            if inj.times > 0 and inj.method == method and inj.path_pattern.search(url.path):
                inj.times -= 1
                raise ApiError(inj.code, "InternalError" if inj.code >= 500 else "Injected", "injected error")
        self._sweep()
        res, ns, name, sub = self._route(url.path)
        table = self._store[(res.group_version, res.plural)]
        if name is None:
            if method == "GET":
                return 200, self._list(res, ns, query)
            if method == "POST":
                return 201, self._create(res, ns, body)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {res.plural}")
        key = (ns or "", name)
        if sub == "eviction":
            if method != "POST" or res.plural != "pods":
                raise ApiError(405, "MethodNotAllowed", "eviction is POST on pods")
            return self._evict(ns or "", name, body if isinstance(body, dict) else {})
        if sub not in (None, "status") or (sub == "status" and not res.has_status):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({sub})")
        current = table.get(key)
        if current is None:
            raise _not_found(res, name)
        if method == "GET":
            return 200, copy.deepcopy(self._with_status(res, current))
        if method == "DELETE":
            return 200, self._delete(res, current, body if isinstance(body, dict) else {})
        if method in ("PUT", "PATCH"):
            if method == "PUT":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the body of a PUT must be an object")
                updated = copy.deepcopy(body)
            else:
                updated = patched(current, content_type, body)
            return 200, self._update(res, current, updated, status_only=sub == "status")
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

    def _route(self, path: str) -> tuple[Resource, str | None, str | None, str | None]:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "v1"]:
            gv, rest = "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        ns: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or (gv, rest[0]) not in _BY_PATH:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        res = _BY_PATH[(gv, rest[0])]
        if ns is not None and not res.namespaced:
            raise ApiError(404, "NotFound", f"{res.plural} are not namespaced")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        return res, ns, name, sub

    def _list(self, res: Resource, ns: str | None, query: dict[str, str]) -> Obj:
        if query.get("watch") in ("true", "1"):
            if res.kind in ("PodDisruptionBudget", "Node", "Pod"):
                raise WatchRequested(res, ns, query)
            raise ApiError(
                400, "BadRequest", "watch is supported for PodDisruptionBudgets, Nodes and Pods only"
            )
        if "fieldSelector" in query:
            check_field_selector(res, query["fieldSelector"])
        stored = sorted(self._store[(res.group_version, res.plural)].items())
        if res.kind == "Event":  # one storage behind both Event APIs
            other = "events.k8s.io/v1" if res.group_version == "v1" else "v1"
            stored += [(k, server_checks.event_as(res.group_version, e))
                       for k, e in sorted(self._store[(other, "events")].items())]  # fmt: skip
        items = []
        for (ons, _), obj in stored:
            if ns is not None and ons != ns:
                continue
            labels = obj["metadata"].get("labels") or {}
            if "fieldSelector" in query and not match_field_selector(obj, query["fieldSelector"]):
                continue
            if "labelSelector" in query and not match_label_selector_string(labels, query["labelSelector"]):
                continue
            items.append(copy.deepcopy(self._with_status(res, obj)))
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.group_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _create(self, res: Resource, ns: str | None, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of a POST must be an object")
        obj = copy.deepcopy(body)
        obj.setdefault("apiVersion", res.group_version)
        obj.setdefault("kind", res.kind)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            if meta.get("namespace") not in (None, ns):
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the URL")
            meta["namespace"] = ns
            if ("", ns or "") not in self._store[("v1", "namespaces")]:
                raise ApiError(
                    404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"}
                )
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "metadata.name or metadata.generateName is required")
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        key = (ns or "", meta["name"])
        table = self._store[(res.group_version, res.plural)]
        if key in table:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{res.plural} "{meta["name"]}" already exists',
                {"name": meta["name"], "kind": res.plural},
            )
        validate(res, obj)
        for k in ("resourceVersion", "uid", "deletionTimestamp"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now_iso()
        meta["resourceVersion"] = self._next_rv()
        if res.kind == "Namespace":
            obj.setdefault("status", {"phase": "Active"})
        if res.kind == "Pod":
            obj.setdefault("status", {"phase": "Pending"})
            if self.emulate_kubelet:
                self._schedule_and_run(obj)
        table[key] = obj
        return copy.deepcopy(self._with_status(res, obj))

    def _update(self, res: Resource, current: Obj, updated: Obj, *, status_only: bool) -> Obj:
        meta = updated.setdefault("metadata", {})
        cur_meta = current["metadata"]
        want_rv = meta.get("resourceVersion")
        if want_rv and want_rv != cur_meta["resourceVersion"]:
            raise _conflict(res, cur_meta["name"])
        if status_only:
            result = copy.deepcopy(current)
            result["status"] = updated.get("status", {})
        else:
            result = updated
            if res.has_status and res.kind != "PodDisruptionBudget":
                result["status"] = copy.deepcopy(current.get("status", {}))
            for k in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
                if k in cur_meta:
                    meta[k] = cur_meta[k]
        result.setdefault("apiVersion", current.get("apiVersion", res.group_version))
        result.setdefault("kind", res.kind)
        validate(res, result)
        result["metadata"]["resourceVersion"] = self._next_rv()
        key = (cur_meta.get("namespace", "") if res.namespaced else "", cur_meta["name"])
        self._store[(res.group_version, res.plural)][key] = result
        return copy.deepcopy(self._with_status(res, result))

    def _delete(self, res: Resource, current: Obj, options: Obj) -> Obj:
        meta = current["metadata"]
        pre = options.get("preconditions") or {}
        if (pre.get("uid") and pre["uid"] != meta["uid"]) or (
            pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]
        ):
            raise ApiError(409, "Conflict", f"Precondition failed for {res.plural} {meta['name']}")
        if res.kind == "Pod":
            return self._delete_pod(current, options.get("gracePeriodSeconds"))
        key = (meta.get("namespace", "") if res.namespaced else "", meta["name"])
        self._store[(res.group_version, res.plural)].pop(key, None)
        self._next_rv()
        if res.kind == "Namespace":
            for (gv, plural), table in self._store.items():
                if _BY_PATH[(gv, plural)].namespaced:
                    for k in [k for k in table if k[0] == meta["name"]]:
                        del table[k]
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": meta["name"], "kind": res.plural, "uid": meta["uid"]},
        }
