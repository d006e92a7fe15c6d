"""The one clock: aware UTC ``now``.

Only the composition (``healer.wiring``, the CLI's entry points, the dashboard factory) reads it;
everything else takes ``now`` (or a ``clock``) as a parameter, so tests and backtests set the time.
"""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(UTC)
