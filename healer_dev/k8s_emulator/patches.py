"""PATCH semantics: JSON patch (RFC 6902), JSON merge patch (RFC 7386), strategic merge patch."""

from __future__ import annotations

import copy
from typing import Any

from healer_dev.k8s_emulator.resources import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiError, Obj

#: Strategic-merge patch merge keys by field name (``x-kubernetes-patch-merge-key`` in the API's
#: OpenAPI schema). Fields not listed are replaced whole (``spec.taints`` and ``tolerations`` are
#: atomic lists in the real schema).
MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "addresses": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
}
#: Primitive lists merged as sets by strategic-merge patch.
PRIMITIVE_MERGE: frozenset[str] = frozenset({"finalizers"})


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, ``null`` deletes, everything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
    return copy.deepcopy(value)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes strategic-merge patch with the merge keys in :data:`MERGE_KEYS`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _strip_directives(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith(("$setElementOrder/", "$retainKeys", "$patch")):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [x for x in result.get(name) or [] if x not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in PRIMITIVE_MERGE:
            merged = list(result.get(key) or [])
            merged += [v for v in value if v not in merged]
            result[key] = merged
        else:
            result[key] = _strip_directives(value)
    return result


def _merge_list(target: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [_strip_directives(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    out = [copy.deepcopy(i) for i in target]
    for item in patch:
        if not isinstance(item, dict):
            out.append(copy.deepcopy(item))
            continue
        key = item.get(merge_key)
        idx = next(
            (n for n, old in enumerate(out) if isinstance(old, dict) and old.get(merge_key) == key), None
        )
        if item.get("$patch") == "delete":
            out = [o for o in out if not (isinstance(o, dict) and o.get(merge_key) == key)]
        elif idx is None:
            out.append(_strip_directives(item))
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"json patch path {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, list):
            doc = doc[int(part)]
        elif isinstance(doc, dict):
            doc = doc[part]
        else:
            raise KeyError(part)
    return doc


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test). Raises ApiError 422 on a bad op."""
    doc = copy.deepcopy(doc)
    for op in ops:
        try:
            kind = op["op"]
            parts = _pointer(op["path"])
            if kind == "test":
                if _walk(doc, parts) != op["value"]:
                    raise ApiError(422, "Invalid", f"json patch test failed at {op['path']}")
                continue
            if kind in ("move", "copy"):
                value = copy.deepcopy(_walk(doc, _pointer(op["from"])))
                if kind == "move":
                    doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
                doc = json_patch(doc, [{"op": "add", "path": op["path"], "value": value}])
                continue
            parent = _walk(doc, parts[:-1])
            last = parts[-1]
            if kind == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    del parent[last]
            elif kind in ("add", "replace"):
                value = copy.deepcopy(op["value"])
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(value)
                    elif kind == "add":
                        parent.insert(int(last), value)
                    else:
                        parent[int(last)] = value
                else:
                    if kind == "replace" and last not in parent:
                        raise KeyError(last)
                    parent[last] = value
            else:
                raise ApiError(422, "Invalid", f"unknown json patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"json patch {op!r} does not apply: {exc!r}") from exc
    return doc


def patched(current: Obj, content_type: str, body: Any) -> Obj:
    """``current`` with a PATCH body applied by its content type (JSON, merge or strategic merge)."""
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == JSON_PATCH:
        if not isinstance(body, list):
            raise ApiError(
                400, "BadRequest", "json: cannot unmarshal object into Go value of type []jsonPatchOp"
            )
        return json_patch(current, body)
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", f"the body of a {ctype} patch must be an object")
    if ctype == MERGE_PATCH:
        return json_merge_patch(current, body)
    if ctype == STRATEGIC_MERGE_PATCH:
        return strategic_merge_patch(current, body)
    raise ApiError(415, "UnsupportedMediaType", f"the emulator does not support {ctype} patches")
