"""Per-node backoff: a node whose reconcile failed is retried later, and its failure logged once.

controller-runtime requeues a failed key with an exponential per-item delay
(``workqueue.DefaultControllerRateLimiter``: 5 ms doubling to 1000 s); healer's passes run on a
schedule of seconds, so the delay starts at :data:`BASE_SECONDS` and doubles to :data:`CAP_SECONDS`.
The same error again is logged at debug level; a new error, or the recovery, at info/warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

log = logging.getLogger(__name__)

#: First retry delay after a failure, seconds.
BASE_SECONDS = 10.0
#: Longest retry delay, seconds.
CAP_SECONDS = 600.0


@dataclass
class _Failing:
    failures: int
    error: str
    retry_at: datetime


@dataclass
class Backoff:
    """Failing nodes and when each may be tried again; lives as long as the controller process."""

    base_seconds: float = BASE_SECONDS
    cap_seconds: float = CAP_SECONDS
    _failing: dict[str, _Failing] = field(default_factory=dict)

    def waiting(self, node: str, now: datetime) -> bool:
        """The node failed recently and its retry time has not come."""
        failing = self._failing.get(node)
        return failing is not None and now < failing.retry_at

    def failed(self, node: str, error: str, now: datetime) -> None:
        """Count a failure; the next try waits twice as long as the last (up to the cap)."""
        previous = self._failing.get(node)
        failures = previous.failures + 1 if previous else 1
        delay = min(self.cap_seconds, self.base_seconds * 2 ** (failures - 1))
        self._failing[node] = _Failing(failures, error, now + timedelta(seconds=delay))
        if previous is None or previous.error != error:
            log.warning("node %s: %s (retrying in %.0f s, then backing off)", node, error, delay)
        else:
            log.debug(
                "node %s: still failing (%d times): %s; next try in %.0f s", node, failures, error, delay
            )

    def succeeded(self, node: str) -> None:
        """Forget the node's failures (said once, when there were some)."""
        if self._failing.pop(node, None) is not None:
            log.info("node %s: reconciled again after failures", node)
