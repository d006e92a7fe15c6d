"""Drain options (one object from the rule to the eviction) and the report of one drain step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DrainOptions:
    """kubectl drain's options, as a rule's ``drain`` action sets them.

    ``timeout_seconds``: from the drain's start until it is reported blocked (seconds).
    ``grace_period_seconds``: given to each eviction; -1 = the pod's own
    ``terminationGracePeriodSeconds``. ``concurrency``: evictions in flight at once. The defaults
    are the rule schema's (``healer.ruleset.schema.DrainAction``). ``budget_wait_seconds``: how
    long one drain step keeps watching the PodDisruptionBudgets that hold its pods, evicting each
    pod as soon as its budget allows (0 = one round per step, held pods wait for the next step).
    ``checkpoint_seconds``: before evicting a pod that requests GPUs, ask it to checkpoint and wait
    up to this long for its answer (0 = do not ask; :mod:`healer.actions.checkpoint`).
    """

    timeout_seconds: float = 3600.0
    grace_period_seconds: int = -1
    delete_emptydir_data: bool = False
    ignore_daemonsets: bool = True
    force: bool = False
    delete_after_timeout: bool = False
    concurrency: int = 8
    budget_wait_seconds: float = 5.0
    checkpoint_seconds: float = 0.0


@dataclass(frozen=True)
class DrainReport:
    """Outcome of one drain step (the drain may need several, across controller restarts).

    ``done``: nothing left to evict; ``blocked``: the deadline passed with pods still protected
    (``blocked_pods`` names them, ``budgets`` names the PodDisruptionBudgets); ``refused``: pods
    kubectl would refuse to drain (emptyDir, unmanaged) when not allowed, with the reason per pod.
    """

    done: bool
    evicted: tuple[str, ...] = ()  # "namespace/name"
    remaining: tuple[str, ...] = ()
    blocked_pods: tuple[str, ...] = ()
    budgets: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    deleted: tuple[str, ...] = ()  # deleted past the deadline (only when the rule says so)
    blocked: bool = False
    kept: tuple[str, ...] = ()  # DaemonSet and mirror pods left in place, as kubectl drain does
    errors: dict[str, str] = field(default_factory=dict)  # pod -> unexpected API error (retried next step)
    stopped: str = ""  # why the step did nothing (e.g. the node is schedulable again: a human uncordon)
    dry_run: bool = False  # what a drain would do now; nothing was evicted
    checkpointing: tuple[str, ...] = ()  # pods asked to checkpoint, not evicted before they answer
    # pod -> requested_at, deadline, and acknowledged_at or deadline_passed_at (RFC 3339 UTC)
    checkpoints: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def refused_any(self) -> bool:
        """kubectl would refuse this drain (``refused`` names the pods and why)."""
        return bool(self.refused)
