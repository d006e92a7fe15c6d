"""Timestamps as the Kubernetes API wants them on the wire.

``MicroTime`` fields (events.k8s.io/v1 ``eventTime``, Lease ``renewTime``/``acquireTime``) must carry
exactly six fractional digits (``2026-03-01T12:00:00.000000+00:00``); the official client serialises
a ``datetime`` with ``isoformat()``, which drops the fraction at a whole second, and the API server
then refuses the object (422). Since client v34 request bodies, dicts included, are validated into
the client's models, so a preformatted string is parsed back into a plain ``datetime``: only a
``datetime`` whose ``isoformat()`` keeps the fraction survives. Source: apimachinery
``metav1.MicroTime`` (``RFC3339Micro``).
"""

from __future__ import annotations

from datetime import UTC, datetime


class MicroTime(datetime):
    """A ``datetime`` whose ``isoformat()`` always has six fractional digits."""

    def isoformat(self, sep: str = "T", timespec: str = "microseconds") -> str:
        return super().isoformat(sep, "microseconds")


def micro_time(at: datetime) -> MicroTime:
    """``at`` (aware) in UTC, as a :class:`MicroTime` for a ``MicroTime`` field of a request body."""
    utc = at.astimezone(UTC)
    return MicroTime(
        utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond, tzinfo=UTC
    )
