"""Record what shadow rules (``mode: shadow``) would have done this tick; the leader only, fenced.

The decisions are rows of their own (``shadow_decisions``) and ``dry_run`` audit rows: nothing a
shadow rule decides moves a node, counts against a budget or reaches the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import NodeActions
from healer.controller.fence import Fence
from healer.engine import shadow
from healer.engine.evaluation import RuleReport
from healer.errors import HealerError
from healer.model.findings import TickFindings
from healer.model.states import RuleHealth
from healer.ruleset.schema import RuleSet
from healer.store import outcomes
from healer.store.session import transaction

log = logging.getLogger(__name__)

#: Rule healths after which a rule's findings this tick are known (a failed query knows nothing).
_EVALUATED = frozenset({RuleHealth.OK, RuleHealth.NO_DATA, RuleHealth.DEGRADED})


def record(
    *,
    findings: TickFindings,
    rules: RuleSet,
    reports: Iterable[RuleReport],
    sessions: sessionmaker[Session],
    now: datetime,
    fence: Fence,
    actor: str = "healer",
    actions: NodeActions | None = None,
) -> tuple[int, int]:
    """Open and close the shadow rules' decisions from this tick's findings (all rules', shadow
    ones included). ``actions``: where a new decision's node is read for its GPU capacity (its
    GPU-hours). Returns (opened, closed); (0, 0) without a shadow rule. Raises ``NotLeader`` when
    this replica stopped leading."""
    names = shadow.shadow_rules(rules)
    if not names:
        return 0, 0
    evaluated = [r.rule for r in reports if r.rule in names and r.health in _EVALUATED]
    firing = shadow.firing(findings, rules)
    would = {name: shadow.would_take(rules.rule(name)) for name in names}
    with transaction(sessions) as session:
        fence.check_db(session)
        opened, closed = outcomes.record_shadow(
            session,
            firing=firing,
            would=would,
            evaluated=evaluated,
            now=now,
            actor=actor,
            capacity=(lambda name: _capacity(actions, name)) if actions is not None else None,
        )
    for row in opened:
        log.info(
            "shadow rule %s would act on %s: %s (nothing done)",
            row.rule,
            row.node_name,
            ", ".join(row.would) or "nothing",
            extra={"rule": row.rule, "node": row.node_name, "shadow": True},
        )
    return len(opened), len(closed)


def _capacity(actions: NodeActions, name: str) -> int | None:
    """The node's ``nvidia.com/gpu`` capacity as read (the watch cache), None when unreadable."""
    try:
        return actions.read_node(name).gpu_capacity
    except HealerError as exc:
        log.info("shadow decision on %s: its GPU capacity is not known (%s)", name, exc)
        return None
