"""The controller: the scheduler's jobs, and the reconcile both passes use.

==============  ==================================================================================
module          job
==============  ==================================================================================
``scheduler``   the process behind ``healer run``: jobs, leadership, shutdown (:class:`Controller`)
``passes``      the tick pass (:func:`remediate`) and the drain pass (:func:`advance_drains`)
``reconcile``   nodes in waves: observe → decide → judge → apply → record (:class:`Reconciler`)
``observe``     the node read once, and its facts from the database
``apply``       a step's effects through ``NodeActions`` (one patch, one status patch, Events)
``record``      the step's transition, memory, audit rows and ticket
``fleet``       fleet-wide facts: candidates, order, nodes out of service, the breaker's input
``..coverage``  (``healer.coverage``) which nodes export each rule's metrics: the rules' node pools,
                refreshed by the scheduler and handed to the pure ``healer.engine.pools``
``backoff``     per-node retry delay after a failure
==============  ==================================================================================
"""

from healer.controller.passes import RemediationResult, advance_drains, remediate
from healer.controller.reconcile import MAX_STEPS_PER_TICK, NodeOutcome, Reconciler
from healer.controller.scheduler import Controller, Leadership, scheduled_tick_time
from healer.engine.schedule import due_groups, tick_seconds

__all__ = [
    "MAX_STEPS_PER_TICK",
    "Controller",
    "Leadership",
    "NodeOutcome",
    "Reconciler",
    "RemediationResult",
    "advance_drains",
    "due_groups",
    "remediate",
    "scheduled_tick_time",
    "tick_seconds",
]
