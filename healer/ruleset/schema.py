"""The rule file schema: Prometheus alerting rules plus healer's keys.

A rule file looks like::

    groups:
      - name: gpu-thermal
        interval: 30s
        rules:
          - name: GpuTooHot
            expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 78
            for: 5m
            keep_firing_for: 10m
            severity: critical
            unit: degrees C
            annotations: {summary: "GPU {{ $labels.gpu }} above 78 C for 5 minutes"}
            actions:
              - quarantine
              - drain: {timeout: 1h}
              - ticket: {provider: default}

Durations are Prometheus duration strings and are held as seconds (float).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from healer.model.drain import DrainOptions
from healer.ruleset.durations import parse_duration

#: Labels tried in order to find the Kubernetes node name of a series (see reference/metrics.md):
#: dcgm-exporter's ``Hostname`` (``hostname`` in newer sources), then common relabelings.
DEFAULT_NODE_LABELS = ("Hostname", "hostname", "node", "kubernetes_node", "nodename")

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: A Kubernetes label value (apimachinery ``IsValidLabelValue``): at most 63 characters,
#: alphanumerics and ``-_.``, starting and ending alphanumeric. Taint values are label values.
_K8S_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")

Seconds = Annotated[float, BeforeValidator(parse_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuarantineAction(_Strict):
    """Cordon (``spec.unschedulable``), add healer's taint, set the node condition False.

    ``scope: gpu``: a finding naming one GPU takes out that GPU only (a DRA DeviceTaintRule, or a
    node annotation) and the node keeps serving; a second GPU, or a finding without a GPU,
    quarantines the node (:mod:`healer.engine.gpu_scope`).
    """

    kind: Literal["quarantine"] = "quarantine"
    taint_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    scope: Literal["node", "gpu"] = "node"


class TaintAction(_Strict):
    """Degrade only: taint the node (no cordon) so pods that tolerate it keep running there."""

    kind: Literal["taint"] = "taint"
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class DrainAction(_Strict):
    """Evict the node's pods through the Eviction API, as ``kubectl drain`` does."""

    kind: Literal["drain"] = "drain"
    timeout: Seconds = Field(3600.0, gt=0, description="Drain deadline, seconds from its start.")
    grace_period: int = Field(-1, ge=-1, description="Pod grace period, seconds; -1 = the pod's own.")
    delete_emptydir_data: bool = False
    ignore_daemonsets: bool = True
    force: bool = Field(False, description="Also evict pods with no controller.")
    delete_after_timeout: bool = Field(
        False, description="Past the deadline, DELETE pods a PodDisruptionBudget still protects (recorded)."
    )
    concurrency: int = Field(8, ge=1, le=256, description="Evictions in flight at once.")
    checkpoint: Seconds = Field(
        0.0,
        ge=0,
        description=(
            "Before evicting a pod that requests GPUs, ask it to checkpoint (pod annotation) and wait "
            "up to this long for its answer, seconds; 0 = evict without asking."
        ),
    )

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_within_timeout(cls, value: float, info: ValidationInfo) -> float:
        timeout = info.data.get("timeout")
        if value and timeout is not None and value >= timeout:
            raise ValueError("checkpoint must be shorter than the drain's timeout")
        return value

    def options(self) -> DrainOptions:
        """The drain options as the controller and the Kubernetes adapter take them."""
        return DrainOptions(
            timeout_seconds=self.timeout,
            grace_period_seconds=self.grace_period,
            delete_emptydir_data=self.delete_emptydir_data,
            ignore_daemonsets=self.ignore_daemonsets,
            force=self.force,
            delete_after_timeout=self.delete_after_timeout,
            concurrency=self.concurrency,
            checkpoint_seconds=self.checkpoint,
        )


#: A ticket template is named, never a path: a built-in (``generic.json.j2``) or a file directly in
#: the directory ``tickets.templates_dir`` names. A path would let a rule send any file the
#: controller can read to the provider.
TEMPLATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def template_name_problem(value: str) -> str | None:
    """Why ``value`` is not a template name (None when it is one)."""
    if TEMPLATE_NAME.fullmatch(value) and ".." not in value:
        return None
    return (
        f"template must be a name such as generic.json.j2 (a built-in or a file in tickets.templates_dir), "
        f"not a path: {value[:200]!r}"
    )


def _template_name(value: str | None) -> str | None:
    if value is not None and (problem := template_name_problem(value)):
        raise ValueError(problem)
    return value


#: A template reference checked by :func:`template_name_problem` (None: the provider's own).
TemplateName = Annotated[str | None, AfterValidator(_template_name)]
#: The same, where a template is always named (a provider's default template).
RequiredTemplateName = Annotated[str, AfterValidator(_template_name)]


class TicketAction(_Strict):
    """Ask the provider to replace the part (webhook through the outbox)."""

    kind: Literal["ticket"] = "ticket"
    provider: str = Field("default", min_length=1)
    template: TemplateName = None


class NotifyAction(_Strict):
    """Tell humans (Kubernetes Event and dashboard) without touching the node."""

    kind: Literal["notify"] = "notify"
    message: str | None = None


Action = Annotated[
    QuarantineAction | TaintAction | DrainAction | TicketAction | NotifyAction, Field(discriminator="kind")
]
ACTION_KINDS = ("quarantine", "taint", "drain", "ticket", "notify")


def _normalise_action(value: Any) -> Any:
    """``quarantine`` → ``{kind: quarantine}``; ``{drain: {timeout: 1h}}`` → ``{kind: drain, ...}``."""
    if isinstance(value, str):
        return {"kind": value}
    if isinstance(value, dict) and len(value) == 1 and "kind" not in value:
        ((kind, options),) = value.items()
        if options is None:
            options = {}
        if isinstance(options, dict):
            return {"kind": kind, **options}
    return value


class Rule(_Strict):
    """One rule: a PromQL condition, how long it must hold, and what to do about it."""

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_:-]*$")
    expr: str = Field(..., description="PromQL; every series it returns is a finding candidate.")
    for_: Seconds = Field(0.0, alias="for", ge=0, description="Condition must hold this long, seconds.")
    keep_firing_for: Seconds = Field(
        0.0, ge=0, description="Recovery hold: clear for this long before a firing finding resolves, seconds."
    )
    severity: Literal["critical", "warning", "info"] = "critical"
    kind: Literal["fault", "no_data"] = Field(
        "fault", description="'no_data' rules mark nodes unknown (exporter down), never faulty."
    )
    node_labels: tuple[str, ...] = Field(DEFAULT_NODE_LABELS, min_length=1)
    gpu_label: str = "gpu"
    unit: str | None = Field(
        None, max_length=100, description="Unit of the expression's value, for evidence (e.g. 'degrees C')."
    )
    sticky: bool = Field(
        False,
        description=(
            "The expression reads a gauge that keeps its last value until the exporter restarts "
            "(dcgm-exporter's DCGM_FI_DEV_XID_ERRORS): after a repair, a series still at the value "
            "seen at repair time is old evidence and neither fails validation nor re-opens the node; "
            "a new value (or a new series) does."
        ),
    )
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    actions: list[Annotated[Action, BeforeValidator(_normalise_action)]] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("expr")
    @classmethod
    def _expr_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("expr must not be empty")
        return value.strip()

    @field_validator("node_labels")
    @classmethod
    def _node_labels_are_label_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [name for name in value if not _LABEL_NAME.match(name)]
        if bad:
            raise ValueError(f"not a Prometheus label name: {', '.join(repr(b) for b in bad)}")
        return value

    @field_validator("gpu_label")
    @classmethod
    def _gpu_label_is_label_name(cls, value: str) -> str:
        if not _LABEL_NAME.match(value):
            raise ValueError(f"not a Prometheus label name: {value!r}")
        return value

    # A field validator (not a model validator) so an error points at the rule's `actions` key;
    # `kind` is declared before `actions`, so it is in `info.data` when it was valid.
    @field_validator("actions")
    @classmethod
    def _actions_make_sense(cls, actions: list[Any], info: ValidationInfo) -> list[Any]:
        kinds = [a.kind for a in actions]
        dupes = sorted({k for k in kinds if kinds.count(k) > 1 and k != "ticket"})
        if dupes:
            raise ValueError(f"action(s) listed twice: {', '.join(dupes)}")
        if "drain" in kinds and "quarantine" not in kinds:
            raise ValueError("drain needs quarantine first (a drained node must be cordoned)")
        if info.data.get("kind") == "no_data" and set(kinds) - {"notify"}:
            raise ValueError("a no_data rule may only notify: missing data is not a hardware fault")
        name = info.data.get("name")
        if {"quarantine", "taint"} & set(kinds) and name and not _K8S_LABEL_VALUE.match(name):
            raise ValueError(
                f"rule name {name!r} becomes the taint's value, which Kubernetes validates as a label "
                "value: at most 63 characters, letters, digits, '-', '_' and '.', starting and ending "
                "with a letter or digit (the API server would refuse the taint)"
            )
        return actions

    @property
    def summary(self) -> str:
        return self.annotations.get("summary", "")


class RuleGroup(_Strict):
    """Rules evaluated together at one interval."""

    name: str = Field(..., min_length=1)
    interval: Seconds | None = Field(None, gt=0, description="Seconds; unset = the scheduler's default.")
    rules: list[Rule] = Field(..., min_length=1)


class RuleFile(_Strict):
    """The top level of one YAML rule file."""

    groups: list[RuleGroup] = Field(..., min_length=1)


class RuleSet(_Strict):
    """Every loaded group, from one or more files; rule names are unique across the set."""

    groups: tuple[RuleGroup, ...]
    sources: tuple[str, ...] = ()

    @property
    def rules(self) -> list[Rule]:
        return [r for g in self.groups for r in g.rules]

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)
