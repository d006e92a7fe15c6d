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

The budget and the circuit breaker of a rule are counted over the rule's node pool: by default the
nodes its input metrics cover (observed from Prometheus, within each labelled pool); a rule, or a
whole group, may name its pool by Kubernetes node labels instead::

    pool:
      name: h100                                  # optional; default the rule's name
      node_selector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}

A Prometheus rule file (``alert:`` and ``record:`` rules, healer's keys as annotations) loads as
the same models (:mod:`healer.ruleset.prometheus_format`); its recording rules are kept in
:attr:`RuleGroup.records`, for Prometheus to evaluate (alerts mode), never by healer.
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
    model_validator,
)
from pydantic_core import PydanticCustomError

from healer.model.drain import DrainOptions
from healer.ruleset.capacity import CapacityRule
from healer.ruleset.durations import format_duration, parse_duration
from healer.ruleset.k8s_names import K8S_LABEL_VALUE as _K8S_LABEL_VALUE
from healer.ruleset.k8s_names import selector_problems

#: Labels tried in order to find the Kubernetes node name of a series (see reference/metrics.md):
#: dcgm-exporter's ``Hostname`` (``hostname`` in newer sources), then common relabelings.
DEFAULT_NODE_LABELS = ("Hostname", "hostname", "node", "kubernetes_node", "nodename")

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: A Prometheus metric name (data model), as a recording rule's ``record`` must be.
_METRIC_NAME = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
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


class _LadderStep(_Strict):
    """One rung of a rule's remediation ladder: what to try, and how long it may take (seconds)."""

    kind: str
    timeout: float

    def label(self) -> str:
        """``reset-gpu (10m)``: the step as records and Events name it."""
        return f"{self.kind} ({format_duration(self.timeout)})"


class ResetGpuStep(_LadderStep):
    """Ask the node agent (or the provider's API) to reset the faulty GPU (``nvidia-smi -r``)."""

    kind: Literal["reset-gpu"] = "reset-gpu"
    timeout: Seconds = Field(600.0, gt=0, description="Reset and clear within this, seconds, or escalate.")


class RebootStep(_LadderStep):
    """Ask the node agent (or the provider's API) to reboot the node."""

    kind: Literal["reboot"] = "reboot"
    timeout: Seconds = Field(1800.0, gt=0, description="Reboot and clear within this, seconds, or escalate.")


class TicketStep(_LadderStep):
    """Ask the provider to replace the part (a ticket through the outbox)."""

    kind: Literal["ticket"] = "ticket"
    provider: str = Field("default", min_length=1)
    template: TemplateName = None
    timeout: Seconds = Field(
        7 * 86400.0, gt=0, description="Resolved within this, seconds, or escalate to the next step."
    )


class NotifyStep(_LadderStep):
    """Tell humans (an Event), then wait ``timeout`` before the next step."""

    kind: Literal["notify"] = "notify"
    message: str | None = None
    timeout: Seconds = Field(0.0, ge=0, description="Wait this long before the next step, seconds.")


LadderStep = Annotated[ResetGpuStep | RebootStep | TicketStep | NotifyStep, Field(discriminator="kind")]
LADDER_KINDS = ("reset-gpu", "reboot", "ticket", "notify")
#: What a rule's findings say the node needs, read by :mod:`healer.engine.ladder`: ``xid-value``
#: (the value is a Xid code, classed by the Xid catalog), ``xid-label`` (the ``xid`` label is),
#: ``recovery-action`` (the value is the driver's nvmlDeviceGpuRecoveryAction_t).
Classify = Literal["xid-value", "xid-label", "recovery-action"]


Action = Annotated[
    QuarantineAction | TaintAction | DrainAction | TicketAction | NotifyAction, Field(discriminator="kind")
]
ACTION_KINDS = ("quarantine", "taint", "drain", "ticket", "notify")

#: Options of actions and ladder steps held as seconds, written as Prometheus durations.
_DURATION_OPTIONS = frozenset({"timeout", "checkpoint"})


def step_options(step: BaseModel, *, everything: bool) -> dict[str, Any]:
    """An action's or ladder step's options (not its ``kind``), durations as Prometheus strings
    (``{timeout: 1h}``): all of them, or those that differ from their defaults plus ``timeout``
    (a deadline is worth reading even when it is the default)."""
    out: dict[str, Any] = {}
    for name, field in type(step).model_fields.items():
        value = getattr(step, name)
        if name == "kind" or (not everything and value == field.default and name != "timeout"):
            continue
        out[name] = format_duration(value) if name in _DURATION_OPTIONS else value
    return out


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


class PoolSpec(_Strict):
    """The nodes a rule's budget and breaker are counted over, named by Kubernetes node labels.

    ``node_selector``: label key → value, every pair must match (a Kubernetes ``nodeSelector``);
    ``name``: the pool's name on the dashboard and in refusals (default: the rule's name). Rules that
    name the same pool must select the same nodes.
    """

    name: str | None = Field(None, min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    node_selector: dict[str, str] = Field(..., min_length=1)

    @field_validator("node_selector")
    @classmethod
    def _selector_is_labels(cls, value: dict[str, str]) -> dict[str, str]:
        problems = selector_problems(value)
        if problems:
            raise ValueError("; ".join(problems))
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
    mode: Literal["acting", "shadow"] = Field(
        "acting",
        description=(
            "'shadow': the rule is evaluated and records what it would have done (and how that "
            "turned out), but never moves a node, touches the cluster or opens a ticket."
        ),
    )
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
    pool: PoolSpec | None = Field(
        None,
        description=(
            "The nodes this rule's budget and breaker count over, by node labels; unset = the group's, "
            "else the nodes its input metrics cover."
        ),
    )
    actions: list[Annotated[Action, BeforeValidator(_normalise_action)]] = Field(default_factory=list)
    classify: Classify | None = Field(
        None,
        description=(
            "How a finding's class (reset, reboot, replace) is read, which picks the default "
            "remediation ladder when the rule sets none (healer.engine.ladder)."
        ),
    )
    ladder: list[Annotated[LadderStep, BeforeValidator(_normalise_action)]] | None = Field(
        None,
        description=(
            "Remediation ladder: steps tried in order after quarantine (and drain), each escalating "
            "to the next when the finding is not cleared within its timeout. Replaces the rule's "
            "ticket actions when set."
        ),
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("expr")
    @classmethod
    def _expr_not_empty(cls, value: str) -> str:
        return _expr(value)

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
            # The name is what to change: `at_field` makes the loader point at the `name:` line.
            raise PydanticCustomError(
                "rule_name_not_taint_value",
                "rule name {name} becomes the taint's value, which Kubernetes validates as a label "
                "value: at most 63 characters, letters, digits, '-', '_' and '.', starting and ending "
                "with a letter or digit (the API server would refuse the taint)",
                {"name": repr(name), "at_field": "name"},
            )
        return actions

    @field_validator("ladder")
    @classmethod
    def _ladder_makes_sense(cls, ladder: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        if ladder is None:
            return None
        if not ladder:
            raise ValueError("ladder must list at least one step (leave it out for none)")
        actions = info.data.get("actions") or []
        kinds = [step.kind for step in ladder]
        if {"reset-gpu", "reboot"} & set(kinds) and "quarantine" not in {a.kind for a in actions}:
            raise ValueError(
                "reset-gpu and reboot need the quarantine action: a GPU is reset or a node rebooted "
                "only once no new work lands on it"
            )
        for i, kind in enumerate(kinds[:-1]):
            if kind == "ticket" and any(k in ("reset-gpu", "reboot") for k in kinds[i + 1 :]):
                raise ValueError("a ticket (replace) comes after reset-gpu and reboot, not before")
        return ladder

    @property
    def summary(self) -> str:
        return self.annotations.get("summary", "")


def _expr(value: str) -> str:
    if not value.strip():
        raise ValueError("expr must not be empty")
    return value.strip()


class RecordingRule(_Strict):
    """A Prometheus recording rule (``record:``) of a Prometheus rule file.

    healer evaluates none: the rule is kept so that ``healer rules export`` writes it back for
    Prometheus to evaluate (alerts mode), where the alerting rules that read ``record`` find it.
    Query mode refuses a rule set holding one (:func:`healer.ruleset.loading.validate_rules`).
    """

    record: str = Field(..., pattern=_METRIC_NAME, description="The metric name of the recorded series.")
    expr: str
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("expr")
    @classmethod
    def _expr_not_empty(cls, value: str) -> str:
        return _expr(value)


class RuleGroup(_Strict):
    """Rules evaluated together at one interval; ``pool`` is every rule's pool unless it names its own.

    ``records``: the group's recording rules, from a Prometheus rule file only (see
    :class:`RecordingRule`); a group holds at least one rule of either kind.
    """

    name: str = Field(..., min_length=1)
    interval: Seconds | None = Field(None, gt=0, description="Seconds; unset = the scheduler's default.")
    pool: PoolSpec | None = None
    records: list[RecordingRule] = Field(default_factory=list)
    rules: list[Rule]

    @field_validator("records")
    @classmethod
    def _records_only_from_prometheus_files(
        cls, value: list[RecordingRule], info: ValidationInfo
    ) -> list[RecordingRule]:
        # The loader validates healer's own format with this context: recording rules have no
        # place there (Prometheus rule files carry them, see the module docstring).
        if value and (info.context or {}).get("format") == "healer":
            raise ValueError(
                "unknown key 'records': recording rules come from Prometheus rule files (record:); "
                "a healer rule puts its whole expression in 'expr:'"
            )
        return value

    @field_validator("rules")
    @classmethod
    def _some_rule(cls, value: list[Rule], info: ValidationInfo) -> list[Rule]:
        # `records` failed its own validation when absent from info.data: not reported twice.
        if not value and "records" in info.data and not info.data["records"]:
            raise ValueError("must not be empty")
        return value


#: ``groups`` absent from a file without capacity rules (reported as a missing key).
_MISSING = object()


class RuleFile(_Strict):
    """The top level of one YAML rule file: health rule ``groups``, ``capacity`` rules
    (:mod:`healer.ruleset.capacity`), or both."""

    groups: list[RuleGroup] = Field(default_factory=list)
    capacity: list[CapacityRule] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _groups_or_capacity(cls, data: Any) -> Any:
        # No capacity key: `groups` is required (and must not be empty), as it always was.
        if isinstance(data, dict) and not data.get("capacity") and not data.get("groups"):
            data = {**data, "groups": data.get("groups", _MISSING)}
        return data

    @field_validator("groups", mode="before")
    @classmethod
    def _not_missing(cls, value: Any) -> Any:
        if value is _MISSING:
            raise PydanticCustomError("missing", "Field required")
        if value == []:
            raise PydanticCustomError(
                "too_short", "List should have at least 1 item after validation, not 0", {"min_length": 1}
            )
        return value


class RuleSet(_Strict):
    """Every loaded group, from one or more files; rule names are unique across the set."""

    groups: tuple[RuleGroup, ...]
    sources: tuple[str, ...] = ()
    #: The capacity rules (burst nodes), from every file's ``capacity`` key.
    capacity: tuple[CapacityRule, ...] = ()

    @property
    def rules(self) -> list[Rule]:
        return [r for g in self.groups for r in g.rules]

    @property
    def records(self) -> list[RecordingRule]:
        """Every recording rule (Prometheus rule files only; evaluated by Prometheus, not healer)."""
        return [r for g in self.groups for r in g.records]

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)

    def pools(self) -> dict[str, PoolSpec]:
        """rule name → the pool it names (its own, else its group's); rules without one are left out."""
        out: dict[str, PoolSpec] = {}
        for group in self.groups:
            for rule in group.rules:
                spec = rule.pool or group.pool
                if spec is not None:
                    out[rule.name] = spec
        return out
