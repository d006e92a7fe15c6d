"""What a real kube-apiserver refuses, for the emulator (:mod:`healer_dev.k8s_emulator`).

Each check mirrors one the real server makes (apimachinery object-meta validation,
``pkg/apis/core/validation``, ``pkg/apis/events/validation``, the field-label conversions each
resource registers), so the demo and the fast tests never accept what a cluster refuses. The
contract tests (``tests/integration/test_k8s_contract.py``) run the same requests on both.
Raises :class:`Refused` (422 ``Invalid``, or 400 ``BadRequest`` for what does not even decode, such
as a MicroTime without its fraction) with the real server's wording.
"""

from __future__ import annotations

import re
from typing import Any

Obj = dict[str, Any]

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$")
#: ``metav1.MicroTime`` on the wire: exactly six fractional digits.
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_META_FIELDS = ("metadata.name", "metadata.namespace")
_CORE_EVENT_FIELDS = (
    *_META_FIELDS,
    *(f"involvedObject.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion",
                                       "fieldPath")),
    "reason", "reportingComponent", "source", "type",
)  # fmt: skip
#: Field selectors each resource registers (its ``AddFieldLabelConversionFunc``); others are 400.
FIELD_SELECTORS: dict[tuple[str, str], tuple[str, ...]] = {
    ("v1", "pods"): (
        *_META_FIELDS, "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
        "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
        "status.podIPs", "status.nominatedNodeName",
    ),
    ("v1", "nodes"): (*_META_FIELDS, "spec.unschedulable"),
    ("v1", "namespaces"): (*_META_FIELDS, "status.phase"),
    ("v1", "events"): _CORE_EVENT_FIELDS,
    ("events.k8s.io/v1", "events"): (
        *_META_FIELDS,
        *(f"regarding.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion",
                                      "fieldPath")),
        "reason", "reportingController", "type",
    ),
}  # fmt: skip


class Refused(Exception):
    """A refusal the emulator answers as a ``Status`` (``code``, ``reason``, ``message``, ``details``)."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def _invalid(kind: str, name: str, errors: list[str]) -> Refused:
    return Refused(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {"; ".join(errors)}',
        {"name": name, "kind": kind.lower() + "s", "causes": [{"reason": "FieldValueInvalid", "message": e}
                                                             for e in errors]},
    )  # fmt: skip


def label_value_errors(value: str) -> list[str]:
    """apimachinery ``IsValidLabelValue``: at most 63 characters, ``[A-Za-z0-9_.-]``, alphanumeric
    at both ends (empty is valid)."""
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _LABEL_VALUE.match(value):
        errors.append(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
            "'.', and must start and end with an alphanumeric character"
        )
    return errors


def qualified_name_errors(value: str) -> list[str]:
    """apimachinery ``IsQualifiedName``: optional DNS-subdomain prefix and ``/``, then a name part of
    at most 63 characters."""
    prefix, _, name = value.rpartition("/")
    errors = []
    if "/" in value and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        errors.append("prefix part must be a lowercase RFC 1123 subdomain")
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        errors.append("name part must consist of alphanumeric characters, '-', '_' or '.', at most 63")
    return errors


def _meta_errors(meta: Obj) -> list[str]:
    errors = []
    generate = meta.get("generateName")
    if generate:
        # Validated like a name whose random suffix is still to come: only a trailing '-' is masked.
        masked = generate[:-1] + "a" if generate.endswith("-") else generate
        if not _DNS1123_SUBDOMAIN.match(masked):
            errors.append(
                f"metadata.generateName: Invalid value: {generate!r}: a lowercase RFC 1123 subdomain "
                "must consist of lower case alphanumeric characters, '-' or '.', and must start and "
                "end with an alphanumeric character"
            )
    name = meta.get("name")
    if name and (len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name)):
        errors.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain")
    for field in ("labels", "annotations"):
        for key, value in (meta.get(field) or {}).items():
            errors += [f"metadata.{field}: Invalid value: {key!r}: {e}" for e in qualified_name_errors(key)]
            if field == "labels":
                errors += [
                    f"metadata.labels: Invalid value: {value!r}: {e}" for e in label_value_errors(value)
                ]
    return errors


def _check_micro_time(obj: Obj, kind: str, path: str) -> None:
    """A MicroTime without six fractional digits does not decode: 400, as the real server says."""
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None or (isinstance(cur, str) and MICRO_TIME.match(cur)):
        return
    raise Refused(
        400,
        "BadRequest",
        f'{kind} in version "v1" cannot be handled as a {kind}: parsing time "{cur}" as '
        '"2006-01-02T15:04:05.000000Z07:00": cannot parse as ".000000"',
    )


def _event_namespace_errors(namespace: str, ref: Obj | None, field: str) -> list[str]:
    ref = ref or {}
    ref_ns = ref.get("namespace") or ""
    if not ref_ns and namespace not in ("", "default"):
        return [f"{field}.namespace: Invalid value: {ref_ns!r}: does not match event.namespace"
                f" (an Event about a cluster-scoped object lives in 'default')"]  # fmt: skip
    if ref_ns and ref_ns != namespace:
        return [f"{field}.namespace: Invalid value: {ref_ns!r}: does not match event.namespace"]
    return []


def validate(group_version: str, kind: str, obj: Obj) -> None:
    """Raise 422 when the real server would refuse to store ``obj`` (create or update)."""
    meta = obj.get("metadata") or {}
    errors = _meta_errors(meta)
    namespace = meta.get("namespace") or ""
    if kind == "Event" and group_version == "events.k8s.io/v1":
        missing = [f for f in ("eventTime", "reportingController", "reportingInstance", "action", "reason")
                   if not obj.get(f)]  # fmt: skip
        errors += [f"{f}: Required value" for f in missing]
        _check_micro_time(obj, kind, "eventTime")
        controller = obj.get("reportingController") or ""
        if controller and "/" not in controller:
            errors.append(f"reportingController: Invalid value: {controller!r}: must be domain/name")
        if obj.get("type") not in (None, "Normal", "Warning"):
            errors.append(f"type: Unsupported value: {obj.get('type')!r}")
        if len((obj.get("note") or "").encode()) > 1024:
            errors.append("note: Too long: may not be more than 1024 bytes")
        errors += _event_namespace_errors(namespace, obj.get("regarding"), "regarding")
    elif kind == "Event":
        if not obj.get("involvedObject"):
            errors.append("involvedObject: Required value")
        errors += _event_namespace_errors(namespace, obj.get("involvedObject"), "involvedObject")
    elif kind == "Lease":
        _check_micro_time(obj, kind, "spec.renewTime")
        _check_micro_time(obj, kind, "spec.acquireTime")
        duration = (obj.get("spec") or {}).get("leaseDurationSeconds")
        if duration is not None and duration <= 0:
            errors.append("spec.leaseDurationSeconds: Invalid value: must be greater than 0")
    elif kind == "Node":
        for i, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
            where = f"spec.taints[{i}]"
            errors += [f"{where}.key: Invalid value: {taint.get('key')!r}: {e}"
                       for e in qualified_name_errors(str(taint.get("key") or ""))]  # fmt: skip
            errors += [f"{where}.value: Invalid value: {taint.get('value')!r}: {e}"
                       for e in label_value_errors(str(taint.get("value") or ""))]  # fmt: skip
            if taint.get("effect") not in TAINT_EFFECTS:
                errors.append(f"{where}.effect: Unsupported value: {taint.get('effect')!r}")
    elif kind == "Pod" and not (obj.get("spec") or {}).get("containers"):
        errors.append("spec.containers: Required value")
    if errors:
        raise _invalid(kind, str(meta.get("name") or meta.get("generateName") or ""), errors)


def check_field_selector(group_version: str, plural: str, selector: str) -> None:
    """Raise 400 when ``selector`` uses a field the resource does not register."""
    allowed = FIELD_SELECTORS.get((group_version, plural), _META_FIELDS)
    for term in filter(None, (t.strip() for t in selector.split(","))):
        field = re.split(r"!=|==|=", term, maxsplit=1)[0].strip()
        if field not in allowed:
            raise Refused(400, "BadRequest", f"field label not supported: {field}")


#: events.k8s.io/v1 field ↔ core/v1 field: one storage, two views (``pkg/apis/events/v1`` conversion).
_EVENT_FIELDS = (
    ("regarding", "involvedObject"), ("note", "message"), ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"), ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"), ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"), ("action", "action"), ("reason", "reason"),
    ("type", "type"), ("eventTime", "eventTime"), ("series", "series"), ("related", "related"),
)  # fmt: skip


def event_as(group_version: str, event: Obj) -> Obj:
    """An Event as the other API shows it: ``group_version`` is the API asked (``v1`` or
    ``events.k8s.io/v1``); ``event`` is stored in the other one."""
    pairs = _EVENT_FIELDS if group_version == "v1" else [(b, a) for a, b in _EVENT_FIELDS]
    out: Obj = {"apiVersion": group_version, "kind": "Event", "metadata": event.get("metadata", {})}
    for theirs, ours in pairs:
        if event.get(theirs) is not None:
            out[ours] = event[theirs]
    return out
