"""Prometheus duration strings (``30s``, ``5m``, ``1h30m``, ``1d``) to seconds."""

from __future__ import annotations

import re

# Same units and order as Prometheus's model.ParseDuration.
_UNITS = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")


def parse_duration(text: str | int | float) -> float:
    """Seconds in a Prometheus duration string; a bare number is taken as seconds.

    Raises:
        ValueError: not a duration (e.g. ``5 minutes``, ``-1m``, ``""``).
    """
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"duration must not be negative: {text!r}")
        return float(text)
    if not isinstance(text, str):  # a YAML date, list or mapping: a ValueError, so pydantic reports it
        raise ValueError(f"not a Prometheus duration: {text!r} (use e.g. 30s, 5m, 1h30m)")
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"not a Prometheus duration: {text!r} (use e.g. 30s, 5m, 1h30m)")
    return float(sum(int(v) * unit for v, unit in zip(match.groups(), _UNITS.values(), strict=True) if v))


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration string for ``seconds`` (``300`` → ``5m``)."""
    if seconds == 0:
        return "0s"
    out, rest = [], int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(out) or f"{int(seconds * 1000)}ms"
