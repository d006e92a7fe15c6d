"""Apply: run one step's effects through :class:`~healer.actions.base.NodeActions`, in order.

The node's spec and metadata changes of a step (cordon, taint, ownership annotations) go to the
adapter as ONE :class:`~healer.model.node.NodeEdit`, so they are one patch; the condition is one
status patch; Events reuse the node as read. Each write returns the node as the API server
answered, which the next step starts from (no re-read). The first failure stops the step.

Each effect comes back as a :class:`Done`, ``found`` when the adapter found the node already as
wanted (a step retried after a crash between its write and its record, or after a failure further
on). The record (:mod:`healer.controller.record`) keeps one audit row per effect and incident: a
found effect is recorded "found applied after restart" when its incident has no row for it yet,
and nothing when it has, so a retried step never records a second "cordon succeeded". Events are
always sent, so always recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, assert_never

from healer.actions.base import NodeActions
from healer.actions.validation import Validator
from healer.controller.repair import RepairPublisher
from healer.engine import lifecycle as lc
from healer.errors import KubernetesError, KubernetesNotFound
from healer.model.drain import DrainOptions, DrainReport
from healer.model.node import NodeEdit, NodeView, Ownership
from healer.model.repair import CAPTURE
from healer.model.states import ActionStatus


@dataclass(frozen=True)
class Done:
    """One effect performed (or the one that failed): an ``actions`` row to record."""

    kind: str
    detail: dict[str, Any]
    status: ActionStatus
    error: str | None = None
    found: bool = False  # the node was already as wanted: this step wrote nothing for it


@dataclass
class Applied:
    """What one step's effects did: the node after them (None: the node is gone), the effects
    done, the first error, and the drain round's report (a ``DrainStep`` effect)."""

    view: NodeView | None
    done: list[Done] = field(default_factory=list)
    error: str | None = None
    drain: DrainReport | None = None


@dataclass(frozen=True)
class DrainPlan:
    """When the drain started (its deadline runs from there) and its options."""

    started_at: datetime
    options: DrainOptions


def apply(
    actions: NodeActions,
    view: NodeView,
    step: lc.Step,
    *,
    incident_id: int | None,
    now: datetime,
    actor: str,
    drain: DrainPlan | None = None,
    check: Callable[[], None] = lambda: None,
    repair: RepairPublisher | None = None,
    validator: Validator | None = None,
    effects: slice = slice(None),
    so_far: Applied | None = None,
) -> Applied:
    """Run ``step``'s effects on the node ``view`` (as read this reconcile).

    ``effects`` runs only those of the step's effects (a wave sends every node's
    :func:`fence_off` part first, then the rest of each step) and ``so_far`` is what the earlier
    part did (its node view is where the rest starts).

    ``check`` runs before each effect (the fence: raises ``NotLeader`` when this replica no longer
    leads, which propagates: what was applied so far is settled by the ownership reconcile).

    ``RequestRepair`` is signed by ``repair`` and written on the node for its agent (a
    ``KubernetesError``-style failure when no publisher is configured); audited as
    ``repair-request``, or ``capture-request`` for a log capture.

    ``StartDrain`` and ``RequestTicket`` are recorded, not applied here. Raises
    ``KubernetesNotFound`` (the node is gone); any other Kubernetes error ends the step with the
    failed effect in ``done``.
    """
    applied = so_far or Applied(view=view)
    node: NodeView = applied.view or view
    todo = list(step.effects)[effects]
    status = actions.status
    i = 0
    while i < len(todo):
        effect = todo[i]
        check()
        try:
            match effect:
                case lc.Cordon() | lc.Taint():
                    edit, rows = _edit(todo, i, incident_id=incident_id, now=now, actor=actor)
                    before, applied.view = node, actions.edit(node, edit)
                    node = applied.view
                    changed = {"cordon": _cordon_changed(before, node), "taint": before.taints != node.taints}
                    applied.done += [
                        Done(kind, detail, status, found=not changed[kind]) for kind, detail in rows
                    ]
                    i += len(rows)
                    continue
                case lc.SetCondition(healthy=healthy, reason=reason, message=message):
                    before, applied.view = (
                        node,
                        actions.set_condition(node, healthy=healthy, reason=reason, message=message, now=now),
                    )
                    node = applied.view
                    found = before.condition_details == node.condition_details
                    applied.done.append(
                        Done("condition", {"healthy": healthy, "reason": reason}, status, found=found)
                    )
                case lc.Event(reason=reason, message=message, warning=warning, key=key):
                    actions.event(node, reason=reason, message=message, warning=warning, now=now)
                    detail: dict[str, Any] = {"reason": reason, "message": message}
                    if key:
                        detail["key"] = key
                    applied.done.append(Done("notify" if key else "event", detail, status))
                case lc.Release():
                    before, applied.view = node, actions.release(node, now=now)
                    node = applied.view
                    found = not (
                        _cordon_changed(before, node)
                        or before.annotations != node.annotations
                        or before.taints != node.taints
                        or before.condition_details != node.condition_details
                    )
                    applied.done.append(Done("release", {}, status, found=found))
                case lc.DrainStep():
                    plan = drain or DrainPlan(started_at=now, options=DrainOptions())
                    applied.drain = actions.drain_step(
                        node, started_at=plan.started_at, now=now, options=plan.options
                    )
                    # The round can take minutes (a budget's wait): the next step (a ticket, once
                    # drained) must see the node as a human may have left it meanwhile.
                    applied.view = node = actions.read_node(node.name)
                case lc.RequestRepair():
                    if repair is None:
                        raise KubernetesError("no repair publisher: repair.actions or its secret unset")
                    request = repair.request(view.name, effect, incident=incident_id or 0, now=now)
                    annotations: dict[str, str | None] = {repair.key: request.signed(repair.secret)}
                    # A log capture is not a repair step (the parts ledger counts repair-requests).
                    what = "capture-request" if request.action == CAPTURE else "repair-request"
                    applied.view = actions.annotate(node, annotations, what=what)
                    node = applied.view
                    detail = {
                        "action": request.action,
                        "gpu": request.gpu,
                        "nonce": request.nonce,
                        "expires": request.expires,
                    }
                    applied.done.append(Done(what, detail, status))
                case lc.StartValidation(job=job):
                    if validator is None:
                        raise KubernetesError("no validation Jobs configured (validation.enabled)")
                    validator.start(node, job, incident_id or 0)
                    applied.done.append(Done("validation-job", {"job": job, "node": node.name}, status))
                case lc.CleanupValidation(job=job):
                    if validator is not None:
                        validator.delete(job)
                        applied.done.append(Done("validation-cleanup", {"job": job}, status))
                case lc.StartDrain() | lc.RequestTicket():
                    pass
                case _:
                    assert_never(effect)
        except KubernetesNotFound:
            raise
        except KubernetesError as exc:
            kind = type(effect).__name__.lower()
            applied.done.append(Done(kind, {}, ActionStatus.FAILED, error=str(exc)))
            applied.error = str(exc)
            return applied
        i += 1
    return applied


def fence_off(step: lc.Step) -> int:
    """How many of ``step``'s first effects take the node out of scheduling (its leading run of
    Cordon and Taint, sent as one patch): the part of a wave's writes that goes out for every
    node before any node's condition, Event or drain. 0: the step does not start with one."""
    n = 0
    for effect in step.effects:
        if not isinstance(effect, lc.Cordon | lc.Taint):
            break
        n += 1
    return n


def _cordon_changed(before: NodeView, after: NodeView) -> bool:
    """The write cordoned (or uncordoned) the node or claimed (or gave up) healer's ownership of
    the cordon. Rewriting only the reason, incident or time annotations of a cordon healer already
    holds (a retried step, an adopted node) is the same cordon, not a new one."""
    claimed = [any(k.endswith("/cordoned-by") for k in v.annotations) for v in (before, after)]
    return before.unschedulable != after.unschedulable or claimed[0] != claimed[1]


def _edit(
    effects: list[lc.Effect], start: int, *, incident_id: int | None, now: datetime, actor: str
) -> tuple[NodeEdit, list[tuple[str, dict[str, Any]]]]:
    """The run of Cordon/Taint effects from ``start`` as one edit, and their rows."""
    edit = NodeEdit()
    rows: list[tuple[str, dict[str, Any]]] = []
    for effect in effects[start:]:
        match effect:
            case lc.Cordon(reason=reason) if edit.cordon is None:
                own = Ownership(incident_id=incident_id or 0, reason=reason, at=now, actor=actor)
                edit = NodeEdit(cordon=own, taint=edit.taint)
                rows.append(("cordon", {"reason": reason}))
            case lc.Taint(value=value, effect=taint_effect) if edit.taint is None:
                edit = NodeEdit(cordon=edit.cordon, taint=(value, taint_effect))
                rows.append(("taint", {"value": value, "effect": taint_effect}))
            case _:
                break
    return edit, rows
