"""One GPU out, each tick: the GPUs that should be out (:func:`healer.engine.gpu_scope.gpus_out`)
against what healer has out now (:class:`~healer.actions.gpu_isolation.GpuIsolation`); the
difference is applied, and each change is an ``actions`` row (kind ``gpu_isolate`` or
``gpu_restore``, target the node, detail: GPU, rule, how: ``dra`` or ``annotation``) with status
``succeeded``, ``failed`` or, in dry-run, ``dry_run``. Each change made is also an Event on the
node (``GpuTakenOut``, Warning; ``GpuReturned``, Normal: events.k8s.io/v1 through the node actions,
as quarantine's Events), and ``healer_gpus_out`` on ``/metrics`` counts the GPUs out per node.

The node lifecycle never sees the contained findings (:func:`healer.engine.gpu_scope.for_nodes`,
applied by the controller before remediation), so a node with one bad GPU stays healthy and
schedulable; a second GPU escalates it to the usual quarantine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from healer.actions.base import NodeActions
from healer.actions.gpu_isolation import IsolationPort
from healer.controller.fence import Fence
from healer.engine.gpu_scope import gpu_scoped, gpus_out
from healer.errors import KubernetesError
from healer.metrics import HealerMetrics
from healer.model.findings import TickFindings
from healer.model.states import ActionStatus
from healer.ruleset.schema import RuleSet
from healer.store import nodes as repo
from healer.store.session import transaction

log = logging.getLogger(__name__)


@dataclass
class GpuIsolationSync:
    """Build it in :mod:`healer.wiring`; the tick calls :meth:`run` after remediation."""

    isolation: IsolationPort
    sessions: sessionmaker[Session]
    actor: str = "healer"
    #: Where the ``GpuTakenOut`` / ``GpuReturned`` Events on the node go (the controller's node
    #: actions: a real Event, or in dry-run a recorded one); None: no Events.
    events: NodeActions | None = None
    #: Where ``healer_gpus_out`` is kept; None: not kept.
    metrics: HealerMetrics | None = None
    #: Whether healer had GPUs out at the last read (None: not read yet). With no ``scope: gpu``
    #: rule and nothing out, a tick costs no API call.
    _anything_out: bool | None = field(default=None, init=False)

    def run(
        self, findings: TickFindings, rules: RuleSet, now: datetime, *, fence: Fence | None = None
    ) -> int:
        """Take out and give back GPUs so that what is out matches ``findings``; the changes made.

        Frozen rules keep their GPUs out (no data is not recovery). A failed read ends the round
        (logged); a failed change is recorded and the others go on.
        """
        fence = fence or Fence()
        if self._anything_out is False and not any(gpu_scoped(r) for r in rules.rules):
            return 0
        wanted = gpus_out(findings, rules)
        try:
            current = self.isolation.current()
        except KubernetesError as exc:
            log.warning("GPU isolation: cannot read what is out now: %s", exc)
            return 0
        self._anything_out = bool(wanted) or any(current.values())
        changes: list[tuple[str, str, str, str]] = []  # (kind, node, gpu, rule)
        for node, gpus in wanted.items():
            for gpu, rule in gpus.items():
                if gpu not in current.get(node, {}):
                    changes.append(("gpu_isolate", node, gpu, rule))
        for node, gpus in current.items():
            for gpu, rule in gpus.items():
                if gpu not in wanted.get(node, {}) and rule not in findings.frozen_rules:
                    changes.append(("gpu_restore", node, gpu, rule))
        out = {node: set(gpus) for node, gpus in current.items()}
        if not changes:
            self._observe(out)
            return 0
        how = self.isolation.mode()
        done = []
        for kind, node, gpu, rule in changes:
            fence.check()
            error = None
            try:
                if kind == "gpu_isolate":
                    self.isolation.isolate(node, gpu, rule)
                else:
                    self.isolation.restore(node, gpu)
                log.info(
                    "%s GPU %s of node %s (%s, rule %s)", kind.removeprefix("gpu_"), gpu, node, how, rule
                )
            except KubernetesError as exc:
                error = str(exc)
                log.warning("%s GPU %s of node %s failed: %s", kind, gpu, node, exc)
            else:
                if kind == "gpu_isolate":
                    out.setdefault(node, set()).add(gpu)
                else:
                    out.get(node, set()).discard(gpu)
                self._event(kind, node, gpu, rule, now)
            done.append((kind, node, gpu, rule, error))
        self._observe(out)
        with transaction(self.sessions) as session:
            fence.check_db(session)
            for kind, node, gpu, rule, error in done:
                row = repo.get_or_create_node(session, node, now=now)
                repo.record_action(
                    session,
                    kind=kind,
                    status=ActionStatus.FAILED if error else self.isolation.status,
                    actor=self.actor,
                    now=now,
                    node=row,
                    error=error,
                    detail={"gpu": gpu, "rule": rule, "how": how},
                )
        return len(done)

    def _event(self, kind: str, node: str, gpu: str, rule: str, now: datetime) -> None:
        """A ``GpuTakenOut`` (Warning) or ``GpuReturned`` (Normal) Event on the node, naming the GPU,
        the rule and what marks it out. A failed Event is logged; the change stands."""
        if self.events is None:
            return
        where = self.isolation.where(node, gpu)
        by = f" (rule {rule})" if rule else ""
        if kind == "gpu_isolate":
            reason = "GpuTakenOut"
            message = (
                f"GPU {gpu} taken out of service by healer{by}: {where}; "
                "the node keeps serving with its other GPUs"
            )
        else:
            reason, message = "GpuReturned", f"GPU {gpu} back in service{by}: {where} removed"
        try:
            self.events.event(node, reason=reason, message=message, warning=kind == "gpu_isolate", now=now)
        except KubernetesError as exc:
            log.warning("event %s on node %s failed: %s", reason, node, exc)

    def _observe(self, out: dict[str, set[str]]) -> None:
        if self.metrics is not None:
            self.metrics.set_gpus_out({node: len(gpus) for node, gpus in out.items()})
