"""The two Prometheus releases the tests run on: Debian's 2.42 (``prometheus`` and ``promtool`` on
PATH) and 3.x built from its Go module by ``tests/prometheus3/build.sh`` (cached by version).

Prometheus 3 changed what a query can answer (its migration guide, prometheus.io/docs/prometheus/
latest/migration/): range selectors and the lookback window are left-open (a sample exactly on the
left edge is out), every UTF-8 string is a valid metric and label name, and the rules of a group
may be evaluated concurrently. The tests whose answer could differ run on both
(``tests/integration/*_prometheus3.py``, through the ``prometheus_release`` fixture).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from healer.sources.local_server import find_binary
from healer_dev.prometheus import PrometheusServer, ScrapeTarget, prometheus_server, prometheus_version

BUILD_HINT = "bash tests/prometheus3/build.sh"


@dataclass(frozen=True)
class PrometheusRelease:
    """One Prometheus release: where its ``prometheus`` and ``promtool`` are.

    ``bindir`` None: the ones on PATH (Debian's); else the directory holding both.
    ``version``: what ``prometheus --version`` says (e.g. ``2.42.0``, ``3.16.0``).
    """

    bindir: Path | None
    version: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def binary(self, name: str) -> str:
        """The path of ``prometheus`` or ``promtool``; raises BinaryNotFound (Debian's missing)."""
        if self.bindir is not None:
            return str(self.bindir / name)
        return find_binary(name, package="prometheus")

    @property
    def prometheus(self) -> str:
        return self.binary("prometheus")

    @property
    def promtool(self) -> str:
        return self.binary("promtool")

    def path(self) -> str:
        """A PATH on which ``prometheus`` and ``promtool`` are this release's (for a ``healer``
        process, which finds them on PATH)."""
        current = os.environ.get("PATH", "")
        return current if self.bindir is None else f"{self.bindir}{os.pathsep}{current}"

    def server(
        self, targets: Sequence[ScrapeTarget], **kwargs: Any
    ) -> contextlib.AbstractContextManager[PrometheusServer]:
        """:func:`healer_dev.prometheus.prometheus_server` running this release."""
        return prometheus_server(targets, binary=self.prometheus, **kwargs)


def debian_release() -> PrometheusRelease:
    """Debian's Prometheus on PATH; raises BinaryNotFound when it is not installed."""
    binary = find_binary("prometheus", package="prometheus")
    return PrometheusRelease(bindir=None, version=prometheus_version(binary))
