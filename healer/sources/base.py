"""What the detection tick needs from a metrics source, and the tick's deadline.

The result shapes (:class:`~healer.engine.evaluation.Sample`,
:class:`~healer.engine.evaluation.QueryResult`) live in the pure core, which imports no adapter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Protocol, runtime_checkable

from healer.engine.evaluation import QueryResult, Sample
from healer.errors import SourceError
from healer.ruleset.schema import Rule

__all__ = ["AlertStateSource", "Deadline", "MetricsSource", "QueryResult", "Sample"]


class Deadline:
    """A point on the monotonic clock by which the tick's queries must be done.

    Adapters are the only code that reads a clock; the pure core never sees this.
    """

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.seconds = seconds
        self._end = clock() + seconds

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self._end - self._clock())

    @property
    def expired(self) -> bool:
        return self._clock() >= self._end


@runtime_checkable
class MetricsSource(Protocol):
    """One instant query at a given evaluation time, bounded by the tick's deadline."""

    #: All queries of one tick must finish within this many seconds.
    tick_deadline_seconds: float

    def query(self, expr: str, *, at: datetime, deadline: Deadline | None = None) -> QueryResult:
        """Evaluate ``expr`` at ``at``.

        Returns the samples (empty = nothing matched) and the source's warnings.

        Raises:
            QueryError: the source refused the expression (the rule is broken).
            SourceUnavailable: timeout, deadline passed, 5xx, transport error, non-JSON answer.
        """
        ...


@runtime_checkable
class AlertStateSource(Protocol):
    """Alerts mode: a source that evaluated the rules itself and reports their alerts."""

    #: The tick's one request must finish within this many seconds.
    tick_deadline_seconds: float

    def alert_states(
        self, rules: Iterable[Rule], *, at: datetime, deadline: Deadline | None = None
    ) -> Mapping[str, QueryResult | SourceError]:
        """Each rule's pending and firing alerts as a ``judged`` :class:`QueryResult`, or the
        :class:`~healer.errors.SourceError` saying why it cannot be judged at ``at``. Never raises
        a SourceError."""
        ...
