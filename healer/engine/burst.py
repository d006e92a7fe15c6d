"""Open or close a burst node: a state machine with ``for`` and a hold (hysteresis). Pure: ``now`` in.

Signals (:func:`short` and :func:`free_again`) come from the :class:`~healer.model.burst.Capacity`
of the cluster: GPUs are *short* when any signal of the rule's ``open`` holds (pending GPU pods, Kueue
pending workloads, free GPUs below a floor); they are *free again* when none holds and at least
``close.free_gpus_at_least`` GPUs are free. Neither is in between (e.g. no GPU free and nothing
waiting: training uses the cluster and inference runs outside): the burst stays as it is.

=========  =================================  ==========================================
state      condition                          step
=========  =================================  ==========================================
closed     short for ``open.for``             open: healer's burst taint removed
open       free again for ``close.hold``      close: the taint put back (NoSchedule)
any        the taint is not as healer left    recorded, nothing changed: the human's choice
           it (a human removed or added it)   stands (``by_hand``) ...
by hand    the signals agree with the         ... until the signals agree with it for their
           human's state for their for/hold   ``for``/hold: recorded, healer manages again
=========  =================================  ==========================================

A shortage or a free spell shorter than its ``for``/hold changes nothing: its clock starts over
the next time (flapping demand toggles nothing).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from healer.model.burst import BurstDecision, BurstMemory, BurstState, Capacity
from healer.ruleset.capacity import CapacityRule


def short(cap: Capacity, rule: CapacityRule) -> str:
    """Why in-cluster GPUs are short now ("" when they are not)."""
    o = rule.open
    if o.pending_gpu_pods and cap.pending_gpu_pods >= o.pending_gpu_pods:
        return f"{cap.pending_gpu_pods} pod(s) requesting GPUs pending"
    if o.kueue_pending_workloads and (cap.kueue_pending or 0) >= o.kueue_pending_workloads:
        return f"{cap.kueue_pending} Kueue workload(s) pending"
    if o.free_gpus_below and cap.free_gpus < o.free_gpus_below:
        return f"{cap.free_gpus} free GPU(s), below {o.free_gpus_below}"
    return ""


def free_again(cap: Capacity, rule: CapacityRule) -> bool:
    """No shortage, and at least ``close.free_gpus_at_least`` GPUs free."""
    return not short(cap, rule) and cap.free_gpus >= rule.close.free_gpus_at_least


def _held(since: datetime | None, now: datetime, seconds: float) -> bool:
    return since is not None and (now - since).total_seconds() >= seconds


def step(
    memory: BurstMemory,
    cap: Capacity,
    rule: CapacityRule,
    now: datetime,
    *,
    observed: BurstState | None = None,
) -> BurstDecision:
    """One run for one burst node (see the module docstring).

    ``observed``: the state the node's taint says now, when healer's last toggle was made for
    real (a difference is a human's); None when it cannot tell (dry-run, or never toggled).
    """
    why_short = short(cap, rule)
    is_free = free_again(cap, rule)
    mem = replace(
        memory,
        short_since=(memory.short_since or now) if why_short else None,
        free_since=(memory.free_since or now) if is_free else None,
    )
    if observed is not None and observed != mem.state:
        verb = "removed" if observed is BurstState.OPEN else "put on"
        return BurstDecision(
            replace(mem, state=observed, by_hand=True),
            toggle=observed,
            reason=f"healer's burst taint {verb} by someone else: left {observed} until the capacity agrees",
        )
    hold, wait = rule.close.hold, rule.open.for_
    short_held, free_held = _held(mem.short_since, now, wait), _held(mem.free_since, now, hold)
    if mem.by_hand:
        agrees = short_held if mem.state is BurstState.OPEN else free_held
        if not agrees:
            return BurstDecision(mem)
        why = f"GPUs short ({why_short})" if mem.state is BurstState.OPEN else f"{cap.free_gpus} GPU(s) free"
        return BurstDecision(
            replace(mem, by_hand=False),
            toggle=mem.state,
            reason=f"{why}, as the hand left it {mem.state}: healer manages the burst node again",
        )
    if mem.state is BurstState.CLOSED and short_held:
        return BurstDecision(
            replace(mem, state=BurstState.OPEN, free_since=None),
            toggle=BurstState.OPEN,
            act=True,
            reason=f"in-cluster GPUs short for {wait:.0f}s ({why_short}): burst opened",
        )
    if mem.state is BurstState.OPEN and free_held:
        return BurstDecision(
            replace(mem, state=BurstState.CLOSED, short_since=None),
            toggle=BurstState.CLOSED,
            act=True,
            reason=f"{cap.free_gpus} GPU(s) free for {hold:.0f}s: burst closed, pods come back",
        )
    return BurstDecision(mem)
