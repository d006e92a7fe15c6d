"""Capacity rules: open and close a burst node (a virtual-kubelet node) as in-cluster GPUs run short.

A capacity rule sits in the same rule files as the health rules, under a top-level ``capacity``
key (a file may hold ``groups``, ``capacity`` or both)::

    capacity:
      - name: inference-overflow
        enabled: true
        burst_nodes: {type: virtual-kubelet}     # node labels, every pair must match
        cluster_nodes: {pool: h100}              # the in-cluster GPU nodes that count (default: all others)
        namespaces: [inference]                  # pending pods counted there only (default: every one)
        open:                                      # in-cluster GPUs are short when any signal holds
          pending_gpu_pods: 1                      # at least this many pods requesting GPUs Pending, unbound
          kueue_pending_workloads: 0               # Kueue Workloads waiting for admission (0: not read)
          free_gpus_below: 0                       # free allocatable GPUs below this (0: not a signal)
          for: 1m                                  # short this long before the burst opens
        close:
          free_gpus_at_least: 1                    # free again: no shortage and at least this many free GPUs
          hold: 10m                                # free again this long before the burst closes
        return:
          pods_per_minute: 6                       # evictions off the burst node, at most this many a minute

The burst is *open* when healer's taint ``<domain>/burst`` is off the burst nodes (pods that
tolerate the provider's own taint may land there) and *closed* when it is on, ``NoSchedule`` only
(never ``NoExecute``, which would evict everything at once). Once closed, the pods on the burst node
that do not tolerate healer's taint are evicted back into the cluster at the ``return`` pace
(:mod:`healer.controller.burst`). The decision is :mod:`healer.engine.burst`; the capacity it reads,
:mod:`healer.engine.capacity`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from healer.ruleset.durations import parse_duration
from healer.ruleset.k8s_names import selector_problems

#: A Prometheus duration string (or a number), held as seconds.
Seconds = Annotated[float, BeforeValidator(parse_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class OpenWhen(_Strict):
    """When in-cluster GPUs are short (any signal that is set), and for how long before opening."""

    pending_gpu_pods: int = Field(
        1,
        ge=0,
        description=(
            "Short when at least this many pods requesting nvidia.com/gpu are Pending and unbound; "
            "0: not a signal."
        ),
    )
    kueue_pending_workloads: int = Field(
        0, ge=0, description="Short when at least this many Kueue Workloads wait for admission; 0: not read."
    )
    free_gpus_below: int = Field(
        0, ge=0, description="Short when fewer free allocatable GPUs than this; 0: not a signal."
    )
    for_: Seconds = Field(
        60.0, alias="for", ge=0, description="Short this long before the burst opens, seconds."
    )

    @model_validator(mode="after")
    def _some_signal(self) -> OpenWhen:
        if not (self.pending_gpu_pods or self.kueue_pending_workloads or self.free_gpus_below):
            raise ValueError(
                "open needs at least one signal: pending_gpu_pods, kueue_pending_workloads or free_gpus_below"
            )
        return self


class CloseWhen(_Strict):
    """When in-cluster GPUs are free again, and for how long before closing (the hysteresis)."""

    free_gpus_at_least: int = Field(
        1, ge=0, description="Free again: no shortage and at least this many free GPUs."
    )
    hold: Seconds = Field(600.0, ge=0, description="Free again this long before the burst closes, seconds.")


class ReturnPace(_Strict):
    """How fast pods come back off a closed burst node."""

    pods_per_minute: float = Field(
        6.0, gt=0, le=600, description="At most this many evictions off the burst nodes a minute (per rule)."
    )


class CapacityRule(_Strict):
    """One capacity rule: which nodes are the burst, when it opens and closes, how pods come back."""

    name: str = Field(
        ..., min_length=1, max_length=63, pattern=r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$"
    )
    enabled: bool = True
    burst_nodes: dict[str, str] = Field(
        ..., min_length=1, description="Node labels selecting the burst nodes."
    )
    cluster_nodes: dict[str, str] = Field(
        default_factory=dict,
        description="In-cluster GPU nodes whose free GPUs count, by label; empty: all but burst nodes.",
    )
    namespaces: list[str] = Field(
        default_factory=list,
        description="Pending pods count only in these namespaces (those that overflow); empty: all.",
    )
    open: OpenWhen = Field(default_factory=lambda: OpenWhen())
    close: CloseWhen = Field(default_factory=lambda: CloseWhen())
    return_: ReturnPace = Field(default_factory=lambda: ReturnPace(), alias="return")
    summary: str = Field("", max_length=500)

    @field_validator("burst_nodes")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        problems = selector_problems(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("cluster_nodes")
    @classmethod
    def _cluster_labels(cls, value: dict[str, str]) -> dict[str, str]:
        problems = selector_problems(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    def in_cluster(self, labels: dict[str, str]) -> bool:
        """The node carrying ``labels`` is in-cluster capacity for this rule (not a burst node)."""
        return not self.selects(labels) and all(labels.get(k) == v for k, v in self.cluster_nodes.items())

    def counts_pending(self, namespace: str) -> bool:
        """A pending pod of ``namespace`` counts as demand for this rule."""
        return not self.namespaces or namespace in self.namespaces

    def selects(self, labels: dict[str, str]) -> bool:
        """The node carrying ``labels`` is one of this rule's burst nodes."""
        return all(labels.get(k) == v for k, v in self.burst_nodes.items())


#: Keys a capacity rule may hold (the loader lists them for an unknown one).
CAPACITY_MODELS: dict[str, type[BaseModel]] = {
    "open": OpenWhen,
    "close": CloseWhen,
    "return": ReturnPace,
}
