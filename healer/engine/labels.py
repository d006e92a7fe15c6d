"""Label values are untrusted data: anyone who can run a pod can shape what an exporter reports.

Pure helpers that make a label value safe to carry through healer (database columns, JSON, HTML,
payloads) without assuming its format:

- :func:`clean_value`: NUL and lone surrogates (which PostgreSQL's ``text``/``json`` and UTF-8
  refuse) become U+FFFD; everything else is kept as is.
- :func:`clean_node_name`: a cleaned value clipped to :data:`MAX_NODE_NAME` characters with a
  hash suffix, so two long names stay two nodes.
- :func:`gpu_index`: the value as a GPU index only when it is a short run of ASCII digits
  (``"²".isdigit()`` is True in Python, and ``int("²")`` raises).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

#: Longest node name: a Kubernetes node name is a DNS subdomain (RFC 1123), at most 253 characters;
#: also the ``nodes.name`` column.
MAX_NODE_NAME = 253
#: Longest GPU index accepted, in digits (no node has a million GPUs; fits any integer column).
MAX_GPU_INDEX_DIGITS = 6
REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_INDEX = re.compile(rf"[0-9]{{1,{MAX_GPU_INDEX_DIGITS}}}")


def clean_value(value: str) -> str:
    """``value`` with NUL and lone surrogates replaced by U+FFFD (a no-op for ordinary text)."""
    return _UNSTORABLE.sub(REPLACEMENT, value)


def clean_labels(labels: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """Every name and value cleaned with :func:`clean_value`; also whether anything changed."""
    cleaned = {clean_value(k): clean_value(v) for k, v in labels.items()}
    return cleaned, cleaned != dict(labels)


def clean_node_name(value: str) -> str:
    """A node name that fits :data:`MAX_NODE_NAME`: cleaned, and when too long clipped to a prefix
    plus ``~`` and 8 hex digits of its SHA-256 (distinct long names stay distinct)."""
    value = clean_value(value)
    if len(value) <= MAX_NODE_NAME:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:8]
    return f"{value[: MAX_NODE_NAME - 9]}~{digest}"


def gpu_index(value: str | None) -> int | None:
    """The GPU index ``value`` names (``"3"`` → 3), or None when it is not 1 to
    :data:`MAX_GPU_INDEX_DIGITS` ASCII digits."""
    if value is None or not _INDEX.fullmatch(value):
        return None
    return int(value)


def clip(value: str | None, length: int) -> str | None:
    """``value`` cleaned and, when longer than ``length`` characters, cut to ``length`` ending
    with an ellipsis (for columns PostgreSQL bounds)."""
    if value is None:
        return None
    value = clean_value(value)
    return value if len(value) <= length else value[: length - 1] + "…"


def gpu_sort_key(value: str | None) -> tuple[int, str]:
    """Sort GPUs by index (``"2"`` before ``"10"``), anything that is no index after them by text."""
    index = gpu_index(value)
    return (index, "") if index is not None else (1 << 30, value or "")
