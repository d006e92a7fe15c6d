"""Admission-time validation the emulator does: what a real API server refuses.

The checks themselves are in :mod:`healer_dev.k8s_emulator.server_checks` (names, ``generateName``,
Node Events outside ``default``, taint keys and values, label keys and values, Pods without
containers, MicroTime precision, the field selectors each resource registers); this module turns
their refusals into the emulator's :class:`ApiError`.
"""

from __future__ import annotations

from healer_dev.k8s_emulator import server_checks
from healer_dev.k8s_emulator.resources import ApiError, Obj, Resource


def validate(res: Resource, obj: Obj) -> None:
    """Refuse (422 Invalid, 400 for an undecodable MicroTime) what a real API server refuses."""
    try:
        server_checks.validate(res.group_version, res.kind, obj)
    except server_checks.Refused as exc:
        raise ApiError(exc.code, exc.reason, exc.message, exc.details) from None


def check_field_selector(res: Resource, selector: str) -> None:
    """400 for a ``fieldSelector`` on a field the resource does not register (as the real server)."""
    try:
        server_checks.check_field_selector(res.group_version, res.plural, selector)
    except server_checks.Refused as exc:
        raise ApiError(exc.code, exc.reason, exc.message, exc.details) from None
