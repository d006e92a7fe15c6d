"""The detection half of a tick: query every rule, evaluate, record.

::

    source.query(rule.expr, at=now)  once per rule, at most ``concurrency`` at a time,
                                     within the tick's deadline
        → addresses()          once, only when some rule returned series: the cluster's Node and
                               exporter pod names and addresses, which check each series' node
        → evaluate(ruleset, results, previous state, now)      (pure)
        → record_reports + record_changes                      (one transaction)
        → DetectionResult(findings for the lifecycle, state for the next tick, ...)

Used by ``healer evaluate --once`` and by the controller's tick
(``healer.controller.scheduler.Controller.tick``). Once the tick's deadline has passed, the
remaining rules are not queried: they are reported unavailable and keep their state, like any rule
whose query failed.

Queries run on a small thread pool (``concurrency``, default 4): the tick costs about its slowest
queries rather than their sum, while the source never sees more than ``concurrency`` queries of
this tick at once. Every query is evaluated at the same ``time=``, so the results are those of
the sequential tick (tested against a real Prometheus).

Alerts mode (``detection.mode: alerts``): the source is an
:class:`~healer.sources.base.AlertStateSource`; Prometheus evaluated the rules, and one request
reads every due rule's pending and firing alerts (``queries`` is 1). Evaluation, recording and
the result are the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from healer.engine.evaluation import (
    EvaluationState,
    FindingChange,
    QueryResult,
    RuleReport,
    evaluate,
    needs_addresses,
)
from healer.errors import HealerError, SourceError
from healer.model.addresses import AddressBook, failed_book
from healer.model.findings import TickFindings
from healer.model.states import RuleHealth
from healer.ruleset.schema import Rule, RuleSet
from healer.sources.base import AlertStateSource, Deadline, MetricsSource
from healer.store.evaluations import load_state, record_changes, record_reports
from healer.store.session import transaction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DetectionResult:
    """One tick's detection.

    ``findings`` go to the lifecycle; ``state`` goes to the next tick's ``run_detection``;
    ``reports`` has one entry per rule (health, error, query seconds); ``changes`` are the
    episode changes written; ``queries`` counts the queries sent (one per rule at most);
    ``duration_seconds`` is the wall time of the whole detection, recording included.
    """

    findings: TickFindings
    state: EvaluationState
    reports: list[RuleReport]
    changes: list[FindingChange]
    queries: int
    duration_seconds: float

    @property
    def source_unavailable(self) -> bool:
        """True when no rule could be evaluated because the source failed (or the deadline passed)."""
        return bool(self.reports) and all(r.health == RuleHealth.UNAVAILABLE for r in self.reports)


def run_detection(
    *,
    ruleset: RuleSet,
    source: MetricsSource | AlertStateSource,
    session_factory: sessionmaker[Session] | None,
    state: EvaluationState,
    now: datetime,
    deadline: Deadline | None = None,
    due_groups: Collection[str] | None = None,
    concurrency: int = 4,
    addresses: Callable[[], AddressBook] | None = None,
) -> DetectionResult:
    """Query, evaluate and record one tick at ``now`` (aware UTC; also the queries' ``time=``).

    Args:
        ruleset: the rules to evaluate, in order.
        source: where the queries go; its ``tick_deadline_seconds`` bounds the tick unless
            ``deadline`` is given.
        session_factory: where to record; None records nothing (a dry look).
        state: the previous tick's ``DetectionResult.state`` (or :func:`initial_state`).
        now: the evaluation time.

    ``due_groups``: names of the groups due this tick (their ``interval`` has passed); the other
    groups' rules are not queried and keep their state. None = every group.

    ``concurrency``: how many queries may be in flight at once (1 = one after another).

    ``addresses``: reads the cluster's address book (the Kubernetes adapter); called at most once,
    and only when some rule returned series: it checks each series' node label and names the node
    of those without one (:meth:`~healer.model.addresses.AddressBook.resolve`). A failure
    (``HealerError``) leaves node labels as they are and is reported in the unresolved series of
    those without one. None = node labels as they are, series without one unresolved.

    Source failures never raise: they become unavailable/error reports and frozen rules.
    Database errors (SQLAlchemy) propagate: the tick owns that boundary.
    """
    started = time.perf_counter()
    deadline = deadline or Deadline(source.tick_deadline_seconds)
    # no_data rules are queried after every other rule has answered: an exporter that dies
    # mid-tick then shows up as "no data" in the same tick as its fault series vanish, never as a
    # clear (recovering) series alone.
    not_due = {
        r.name for g in ruleset.groups if due_groups is not None and g.name not in due_groups for r in g.rules
    }
    due = [r for r in ruleset.rules if r.name not in not_due]
    results: dict[str, QueryResult | SourceError] = {}
    durations: dict[str, float] = {}
    if isinstance(source, AlertStateSource):
        t0 = time.perf_counter()
        results.update(source.alert_states(due, at=now, deadline=deadline) if due else {})
        durations = dict.fromkeys(results, time.perf_counter() - t0)
        queries = 1 if due else 0
    else:
        query_source: MetricsSource = source
        with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="healer-query") as pool:
            for phase in ([r for r in due if r.kind != "no_data"], [r for r in due if r.kind == "no_data"]):
                answers = pool.map(lambda rule: _query(query_source, rule, now, deadline), phase)
                for rule, answer in zip(phase, answers, strict=True):
                    if (
                        answer is not None
                    ):  # None: the deadline passed first; evaluate() reports it unavailable
                        results[rule.name], durations[rule.name] = answer
        queries = len(results)
    book = None
    if addresses is not None and needs_addresses(ruleset, results):
        try:
            book = addresses()
        except HealerError as exc:
            log.warning("node addresses could not be read: %s", exc)
            book = failed_book(str(exc))
    evaluation = evaluate(
        ruleset=ruleset,
        results=results,
        previous=state,
        now=now,
        durations=durations,
        not_due=not_due,
        addresses=book,
    )
    for report in evaluation.reports:
        if report.cleaned:
            log.warning("rule %s: %s", report.rule, report.warnings[-1])
    if session_factory is not None:
        with transaction(session_factory) as session:
            record_reports(session, evaluation.reports)
            record_changes(session, evaluation.changes, now=now)
    return DetectionResult(
        findings=evaluation.findings,
        state=evaluation.state,
        reports=evaluation.reports,
        changes=evaluation.changes,
        queries=queries,
        duration_seconds=time.perf_counter() - started,
    )


def _query(
    source: MetricsSource, rule: Rule, now: datetime, deadline: Deadline
) -> tuple[QueryResult | SourceError, float] | None:
    """One rule's query and its seconds, or None when the tick's deadline passed before it started."""
    if deadline.expired:
        return None
    t0 = time.perf_counter()
    try:
        answer: QueryResult | SourceError = source.query(rule.expr, at=now, deadline=deadline)
    except SourceError as exc:
        answer = exc
    return answer, time.perf_counter() - t0


def initial_state(session_factory: sessionmaker[Session] | None) -> EvaluationState:
    """The state to start from: the open episodes in the database (empty without one)."""
    if session_factory is None:
        return EvaluationState()
    with session_factory() as session:
        return load_state(session)
