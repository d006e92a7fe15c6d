"""Per-node backoff: a node whose reconcile failed is retried later, and its failure logged once.

controller-runtime requeues a failed key with an exponential per-item delay
(``workqueue.DefaultControllerRateLimiter``: 5 ms doubling to 1000 s); healer's passes run on a
schedule of seconds. A transient API failure is retried inside the call that met it
(:mod:`healer.actions.apiretry`: reads a few times within a second, writes with a short backoff,
``Retry-After`` honoured), so a failure that reaches this module has outlived those tries. The
first :data:`GRACE_FAILURES` failures in a row are retried on the very next pass, with no delay:
a step that failed half done (cordoned, still recorded ``suspect``) is completed a pass later,
not after a stall. Only failures beyond those back off: :data:`BASE_SECONDS`, doubling to
:data:`CAP_SECONDS`, so a node failing pass after pass (an RBAC refusal, an admission webhook, an
API server that stays down) stops costing a request every pass.

Reads and writes count alike here: the in-call policy is where they differ (a failed read is cheap
to repeat and changes nothing; a write is retried with more patience). Which request of the step
failed matters less than whether the node keeps failing, and one free pass costs a failing node
one request more per failure streak.

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
#: Failures in a row retried on the next pass before the delay starts.
GRACE_FAILURES = 1


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
    grace_failures: int = GRACE_FAILURES
    _failing: dict[str, _Failing] = field(default_factory=dict)

    def waiting(self, node: str, now: datetime) -> bool:
        """The node failed recently and its retry time has not come."""
        failing = self._failing.get(node)
        return failing is not None and now < failing.retry_at

    def failed(self, node: str, error: str, now: datetime) -> None:
        """Count a failure: within the grace, the node is tried again on the next pass; after it,
        each try waits twice as long as the last, from ``base_seconds`` up to ``cap_seconds``."""
        previous = self._failing.get(node)
        failures = previous.failures + 1 if previous else 1
        beyond = failures - self.grace_failures
        delay = 0.0 if beyond <= 0 else min(self.cap_seconds, self.base_seconds * 2 ** (beyond - 1))
        self._failing[node] = _Failing(failures, error, now + timedelta(seconds=delay))
        when = "on the next pass" if delay == 0 else f"in {delay:.0f} s"
        if previous is None or previous.error != error:
            log.warning("node %s: %s (retrying %s, then backing off)", node, error, when)
        else:
            log.debug("node %s: still failing (%d times): %s; next try %s", node, failures, error, when)

    def succeeded(self, node: str) -> None:
        """Forget the node's failures (said once, when there were some)."""
        if self._failing.pop(node, None) is not None:
            log.info("node %s: reconciled again after failures", node)
