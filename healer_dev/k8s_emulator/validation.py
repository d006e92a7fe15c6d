"""Admission-time validation the emulator does (Events: ``events.k8s.io/v1`` and core ``v1``)."""

from __future__ import annotations

from healer_dev.k8s_emulator.resources import ApiError, Obj, Resource


def validate(res: Resource, obj: Obj) -> None:
    """Refuse (422 Invalid) the objects a real API server refuses: Events without their required fields."""
    if res.group_version == "events.k8s.io/v1":
        missing = [
            f for f in ("eventTime", "reportingController", "reportingInstance", "action", "reason")
            if not obj.get(f)
        ]  # fmt: skip
        if missing:
            raise ApiError(422, "Invalid", f"Event is invalid: required: {', '.join(missing)}")
    if res.kind == "Event" and res.group_version == "v1" and not obj.get("involvedObject"):
        raise ApiError(422, "Invalid", "Event is invalid: involvedObject: Required value")
