"""Prometheus history as ticks: range queries cut into per-tick instant results, chunk by chunk.

A range query is Prometheus evaluating the expression as an instant query at ``start``,
``start + step``, ... ``end`` (``/api/v1/query_range``, prometheus/prometheus ``promql/engine.go``),
so slicing its matrix by timestamp gives exactly what the controller's instant queries would have
returned at those times (within the lookback delta and staleness the data had). The window is
queried one chunk at a time (:data:`DEFAULT_CHUNK_SECONDS`), every expression per chunk, and the
chunk's ticks are yielded before the next chunk is fetched: memory is bounded by one chunk of
results, whatever the window.

Errors: a query that fails for a chunk yields its :class:`~healer.errors.SourceError` for every
tick of the chunk (the replay freezes that rule, as the controller would).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta

from healer.engine.evaluation import QueryResult, Sample
from healer.errors import SourceError
from healer.sources.prometheus_range import PrometheusRange

#: Seconds of history per range query: 2 h at a 30 s step is 240 points per series, well under
#: Prometheus's 11,000-points-per-series limit, and small enough to bound memory on 2,048 nodes.
DEFAULT_CHUNK_SECONDS = 7200.0

Tick = tuple[datetime, dict[str, QueryResult | SourceError]]


def tick_times(start: datetime, end: datetime, step_seconds: float) -> list[datetime]:
    """``start``, ``start + step`` ... up to and including ``end`` (aware UTC)."""
    count = math.floor((end - start).total_seconds() / step_seconds + 1e-9) + 1
    return [start + timedelta(seconds=i * step_seconds) for i in range(max(count, 0))]


def history_ticks(
    source: PrometheusRange,
    queries: Mapping[str, str],
    *,
    start: datetime,
    end: datetime,
    step_seconds: float,
    chunk_seconds: float = DEFAULT_CHUNK_SECONDS,
    progress: Callable[[int], None] | None = None,
) -> Iterator[Tick]:
    """Yield ``(time, {name: result})`` for every tick from ``start`` to ``end`` every ``step_seconds``.

    Args:
        source: the range-query adapter.
        queries: name → PromQL (a rule's name and its ``expr``; equal expressions are queried once).
        start, end: the window (aware UTC), both ends included.
        step_seconds: seconds between ticks.
        chunk_seconds: seconds of history per range query.
        progress: called with the number of ticks done after each chunk.
    """
    chunk_ticks = max(1, int(chunk_seconds // step_seconds))
    by_expr: dict[str, list[str]] = {}
    for name, expr in queries.items():
        by_expr.setdefault(expr, []).append(name)
    done = 0
    cursor = start
    while cursor <= end:
        chunk_end = min(end, cursor + timedelta(seconds=step_seconds * (chunk_ticks - 1)))
        times = tick_times(cursor, chunk_end, step_seconds)
        per_tick: dict[int, dict[str, QueryResult | SourceError]] = {_key(t): {} for t in times}
        for expr, names in by_expr.items():
            try:
                series = source.query_range(expr, start=cursor, end=chunk_end, step_seconds=step_seconds)
            except SourceError as exc:
                for results in per_tick.values():
                    results.update(dict.fromkeys(names, exc))
                continue
            samples: dict[int, list[Sample]] = {}
            for s in series:
                for ts, value in s.points:
                    samples.setdefault(round(ts * 1000), []).append(Sample(labels=s.labels, value=value))
            for key, results in per_tick.items():
                result = QueryResult(samples=samples.get(key, []))
                results.update(dict.fromkeys(names, result))
        for t in times:
            yield t, per_tick.pop(_key(t))
        done += len(times)
        if progress is not None:
            progress(done)
        cursor = chunk_end + timedelta(seconds=step_seconds)


def _key(t: datetime) -> int:
    return round(t.timestamp() * 1000)


def utc(value: datetime) -> datetime:
    """``value`` as aware UTC (a naive time is taken as UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
