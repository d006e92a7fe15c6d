"""Settings: built once in the entry point (``load_settings``) and passed down.

Sources, highest priority first: keyword arguments, ``HEALER_``-prefixed environment variables
(nested groups with ``__``, e.g. ``HEALER_DATABASE__URL``), the YAML file given with ``--config``
(or ``HEALER_CONFIG``), then the defaults below, which give a working local setup (SQLite file,
Prometheus on localhost, dry-run on).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from healer.errors import ConfigError
from healer.model import limits as engine_limits
from healer.model.limits import SafetyLimits
from healer.model.quota import Flavor, QuotaPolicy
from healer.ruleset.device_filter import DeviceFilter, check_device_regex
from healer.ruleset.schema import RequiredTemplateName, TemplateName

#: Days of a maintenance window, as the settings spell them.
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class _Group(BaseModel):
    """A settings group: a misspelled key is an error, never a silently ignored default."""

    model_config = ConfigDict(extra="forbid")


class PrometheusSettings(_Group):
    """Where healer reads metrics."""

    url: str = Field("http://127.0.0.1:9090", description="Prometheus (or Thanos/Mimir) base URL.")
    timeout_seconds: float = Field(10.0, gt=0, description="Connect+read timeout of one query, seconds.")
    tick_deadline_seconds: float = Field(
        30.0, gt=0, description="All queries of one tick must finish within this many seconds."
    )
    max_concurrent_queries: int = Field(
        4, ge=1, le=32, description="Queries of one tick in flight at once (1 = one after another)."
    )
    verify_tls: bool = True
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers (e.g. tenant).")
    unavailable_grace_seconds: float = Field(
        60.0,
        ge=0,
        description="No rule could be queried this long (seconds): /readyz fails, the dashboard turns red.",
    )


class InfinibandSettings(_Group):
    """Which HCAs the InfiniBand rules count (rules/README.md, "Which InfiniBand devices count").

    Written at load time into every ``node_infiniband_*`` selector of every rule
    (:mod:`healer.ruleset.device_filter`); ``healer rules export`` writes it into the exported rules.
    """

    device_include: str = Field(
        ".+",
        description="Anchored Prometheus (RE2) regex: the HCAs (node_exporter `device`, e.g. mlx5_0) "
        "that count; default every one.",
    )
    device_exclude: str = Field(
        "",
        description="Anchored Prometheus (RE2) regex: HCAs that never count (management, storage, "
        "bonded pairs), e.g. 'mlx5_(bond_.*|9)'; default none.",
    )

    @field_validator("device_include", "device_exclude")
    @classmethod
    def _regex(cls, value: str, info: ValidationInfo) -> str:
        if info.field_name == "device_include" and not value:
            raise ValueError("empty: it matches no device (every device: '.+')")
        return check_device_regex(value)

    def device_filter(self) -> DeviceFilter:
        """The filter the rule loader writes into the rules."""
        return DeviceFilter(include=self.device_include, exclude=self.device_exclude)


class DetectionSettings(_Group):
    """How healer learns what fires (rules/README.md, "Query mode or alerts mode")."""

    mode: Literal["query", "alerts"] = Field(
        "query",
        description=(
            "query: healer sends each rule's PromQL to Prometheus every tick; alerts: Prometheus "
            "evaluates the exported rule file (`healer rules export`) and healer reads only its "
            "pending and firing alerts (/api/v1/rules), so a tick costs what fires."
        ),
    )
    stale_after_intervals: float = Field(
        3.0,
        gt=1,
        description=(
            "alerts mode: a rule Prometheus last evaluated more than this many of its group's "
            "intervals ago is stale; healer neither fires nor resolves on it (its rule is frozen)."
        ),
    )
    alertmanager_token_env: str | None = Field(
        None,
        description=(
            "alerts mode: environment variable holding the bearer token Alertmanager sends to "
            "POST /api/v1/alertmanager/webhook (docs/operations.md); unset with "
            "alertmanager_token_file: the receiver refuses every request."
        ),
    )
    alertmanager_token_file: Path | None = Field(
        None, description="alerts mode: file holding that bearer token (a Secret mount); re-read per request."
    )
    wake_min_interval_seconds: float = Field(
        1.0,
        gt=0,
        le=60,
        description=(
            "alerts mode: Alertmanager notifications start an early tick at most this often, "
            "seconds; those arriving meanwhile share one tick."
        ),
    )

    @model_validator(mode="after")
    def _receiver_only_in_alerts_mode(self) -> DetectionSettings:
        if self.mode != "alerts" and (self.alertmanager_token_env or self.alertmanager_token_file):
            raise ValueError(
                "alertmanager_token_env/_file: the Alertmanager receiver wakes alerts mode only; "
                "set detection.mode: alerts (query mode has no alerts to be told about)"
            )
        return self

    @property
    def recording_rules(self) -> bool:
        """Whether rule files may hold Prometheus recording rules: in alerts mode only, where
        Prometheus evaluates them (query mode evaluates alerting rules and records nothing)."""
        return self.mode == "alerts"


class KubernetesSettings(_Group):
    """How healer talks to the cluster and marks what it did."""

    kubeconfig: Path | None = Field(
        None, description="Kubeconfig file; unset = in-cluster or ~/.kube/config."
    )
    context: str | None = None
    namespace: str = Field("healer-system", description="Namespace of healer's Lease.")
    lease_name: str = "healer-leader"
    lease_duration_seconds: int = Field(15, ge=5, description="Others take over after this many seconds.")
    renew_interval_seconds: float = Field(5.0, gt=0)
    domain: str = Field("healer.dev", description="Prefix of healer's taint, annotations and labels.")
    condition_type: str = Field("GpuHealthy", description="Node condition healer sets to False.")
    opt_out_label: str = Field(
        "healer.dev/opt-out", description="Nodes with this label = 'true' are never touched."
    )
    pool_label: str = Field(
        "node.kubernetes.io/instance-type", description="Node label grouping nodes into pools for budgets."
    )
    pool_fallback_labels: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu.product"],
        description=(
            "Labels tried in order when a node lacks pool_label (GPU feature discovery's product label "
            "by default); a node with none is in pool 'default' if it has GPUs, 'no-gpu' if not."
        ),
    )
    request_timeout_seconds: float = Field(10.0, gt=0)
    exporter_pod_selector: str = Field(
        "app.kubernetes.io/name in (prometheus-node-exporter, node-exporter, dcgm-exporter)",
        description=(
            "Label selector of the exporter pods (all namespaces) whose podIP names their node for "
            "series without a node label (node_exporter adds none; `instance` is podIP:port). The "
            "default matches the prometheus-node-exporter and dcgm-exporter Helm charts; '' = look "
            "at Node addresses (InternalIP, Hostname) only."
        ),
    )
    drain_skip_wait_for_delete_timeout_seconds: float = Field(
        300.0,
        ge=0,
        description=(
            "On a NotReady node, a pod terminating longer than this counts as gone and the drain goes "
            "on (kubectl drain's --skip-wait-for-delete-timeout), seconds; 0 = wait forever."
        ),
    )

    checkpoint_timeout_seconds: float = Field(
        600.0,
        gt=0,
        description=(
            "A pod labelled <domain>/checkpoint=true is asked to checkpoint before its eviction and "
            "waited for this long when the drain's rule sets no checkpoint of its own, seconds."
        ),
    )

    @model_validator(mode="after")
    def _renew_faster_than_lease(self) -> KubernetesSettings:
        if self.renew_interval_seconds >= self.lease_duration_seconds:
            raise ValueError("renew_interval_seconds must be shorter than lease_duration_seconds")
        return self


class DatabaseSettings(_Group):
    """Where healer records findings, transitions, actions and tickets."""

    url: str = Field(
        "sqlite:///healer.db", description="SQLAlchemy URL; postgresql+psycopg://... in production."
    )
    echo: bool = False

    @field_validator("url")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if not value.startswith(("sqlite", "postgresql")):
            raise ValueError("only sqlite:// and postgresql+psycopg:// URLs are supported")
        return value


class SchedulerSettings(_Group):
    """How often the background jobs run."""

    default_interval_seconds: float = Field(30.0, gt=0, description="Tick interval for groups without one.")
    outbox_interval_seconds: float = Field(5.0, gt=0, description="Ticket delivery job period.")
    drain_interval_seconds: float = Field(10.0, gt=0, description="Drain progress job period.")
    burst_interval_seconds: float = Field(
        5.0, gt=0, description="Capacity rules' burst job period (toggles and at most one pod back a run)."
    )
    retention_days: int = Field(90, ge=1, description="Evaluations and closed incidents older are pruned.")


class MaintenanceWindow(_Group):
    """A recurring window (UTC) during which a pool is not remediated."""

    pool: str = Field("*", description="Pool name, or '*' for every pool.")
    days: list[Weekday] = Field(default_factory=lambda: list(WEEKDAYS))
    start: str = Field(..., pattern=r"^\d\d:\d\d$", description="HH:MM, UTC.")
    end: str = Field(..., pattern=r"^\d\d:\d\d$", description="HH:MM, UTC; may be before start (overnight).")

    def limits(self) -> engine_limits.MaintenanceWindow:
        """The window as the pure engine takes it."""
        days = tuple(self.days)
        return engine_limits.MaintenanceWindow(start=self.start, end=self.end, pool=self.pool, days=days)


class SafetySettings(_Group):
    """The limits that keep healer from making things worse."""

    dry_run: bool = Field(
        True, description="Record intended actions only. Turn off once the rules are trusted."
    )
    max_unhealthy: int = Field(
        2, ge=0, description="Nodes out of service at once per pool (in flight count)."
    )
    max_unhealthy_percent: float = Field(
        10.0,
        ge=0,
        le=100,
        description=(
            "Same, as % of the pool, rounded down (Cluster API); budget_floor_nodes keeps tiny pools usable."
        ),
    )
    breaker_nodes: int = Field(
        5, ge=1, description="Trip when more nodes than this turn bad within the window."
    )
    breaker_percent: float = Field(
        20.0, gt=0, le=100, description="... or more than this % of one pool's nodes (not the cluster's)."
    )
    breaker_min_nodes: int = Field(
        3,
        ge=1,
        description=(
            "The % trigger needs at least this many bad nodes in the pool (the floor for tiny pools: "
            "in a pool of 4, one or two bad nodes never trip it)."
        ),
    )
    breaker_window_seconds: float = Field(300.0, gt=0)
    budget_floor_nodes: int = Field(
        1,
        ge=0,
        description=(
            "Nodes any pool may have out of service at once however small it is (never more than "
            "max_unhealthy): 10% of a 6-node pool rounds down to 0, and such a pool could never be "
            "remediated. 0 = no floor (Cluster API's rounding alone)."
        ),
    )
    coverage_refresh_seconds: float = Field(
        300.0,
        gt=0,
        description=(
            "How often the rules' node pools (the nodes exporting each rule's input metrics) are "
            "observed from Prometheus, seconds; one query per node-label chain. The rules' blind "
            "spots are observed as often, by a job of their own."
        ),
    )
    maintenance_windows: list[MaintenanceWindow] = Field(default_factory=list)
    recovery_hold_seconds: float = Field(
        300.0, ge=0, description="A repaired node must stay clear this long before it returns to service."
    )
    allow_missing_providers: bool = Field(
        False,
        description=(
            "Act (dry_run off) even when a rule opens tickets with a provider tickets.providers lacks: "
            "those nodes are taken out of service and their repair is never asked for."
        ),
    )
    drain_blocked_alert_seconds: float = Field(
        3600.0,
        gt=0,
        description="The dashboard flags nodes whose drain has been blocked longer than this, seconds.",
    )

    def limits(self) -> SafetyLimits:
        """The limits as the pure engine takes them (no pydantic in ``healer.engine``)."""
        return SafetyLimits(
            max_unhealthy=self.max_unhealthy,
            max_unhealthy_percent=self.max_unhealthy_percent,
            breaker_nodes=self.breaker_nodes,
            breaker_percent=self.breaker_percent,
            breaker_min_nodes=self.breaker_min_nodes,
            budget_floor_nodes=self.budget_floor_nodes,
            breaker_window_seconds=self.breaker_window_seconds,
            maintenance_windows=tuple(w.limits() for w in self.maintenance_windows),
        )


class GpuIsolationSettings(_Group):
    """How one GPU is taken out for rules with ``quarantine: {scope: gpu}``
    (:mod:`healer.actions.gpu_isolation`)."""

    mode: Literal["auto", "dra", "annotation"] = Field(
        "auto",
        description=(
            "dra: a DeviceTaintRule (resource.k8s.io/v1alpha3); annotation: the node annotation "
            "<domain>/gpus-out; auto: dra where the cluster serves DeviceTaintRules, else annotation."
        ),
    )
    driver: str = Field(
        "gpu.nvidia.com", description="The DRA driver publishing the GPUs (ResourceSlice driver)."
    )
    device_name: str = Field(
        "gpu-{gpu}", description="The GPU's DRA device name; {gpu} is the finding's GPU index."
    )
    pool: str = Field("{node}", description="The DRA pool of a node's GPUs; {node} is the node name.")
    effect: Literal["NoSchedule", "NoExecute"] = Field(
        "NoSchedule", description="The device taint's effect (NoExecute also evicts pods using the GPU)."
    )


class KueueFlavor(_Group):
    """A Kueue ResourceFlavor whose GPU quota healer keeps: its name and its ``spec.nodeLabels``."""

    name: str = Field(..., min_length=1, description="The ResourceFlavor's metadata.name.")
    node_labels: dict[str, str] = Field(
        default_factory=dict, description="The flavor's spec.nodeLabels: the nodes whose GPUs it counts."
    )


class KueueSettings(_Group):
    """Kueue quota sync (off by default): keep the ``nominalQuota`` of ``resource`` in the chosen
    ClusterQueues equal to the healthy capacity of each flavor's nodes (``healer.engine.quota``)."""

    enabled: bool = Field(False, description="Run the quota sync (the leader only, every interval).")
    cluster_queues: list[str] = Field(
        default_factory=list, description="ClusterQueues whose quota healer manages (metadata.name)."
    )
    flavors: list[KueueFlavor] = Field(
        default_factory=list, description="ResourceFlavors to keep in step, with their node labels."
    )
    resource: str = Field("nvidia.com/gpu", description="The resource whose nominalQuota follows capacity.")
    headroom: int = Field(0, ge=0, description="GPUs kept out of the quota (count).")
    floor: int = Field(0, ge=0, description="The quota never goes below this many GPUs.")
    hysteresis: int = Field(
        1, ge=1, description="A shortfall smaller than this many GPUs does not lower the quota."
    )
    lower_after_seconds: float = Field(
        60.0, ge=0, description="A shortfall must last this long before the quota is lowered, seconds."
    )
    interval_seconds: float = Field(30.0, gt=0, description="How often the quota is synced, seconds.")
    field_manager: str = Field(
        "healer-kueue", min_length=1, max_length=128, description="Server-side apply field manager."
    )

    @model_validator(mode="after")
    def _enabled_needs_targets(self) -> KueueSettings:
        if self.enabled and not (self.cluster_queues and self.flavors):
            raise ValueError("kueue.enabled needs cluster_queues and flavors")
        return self

    def policy(self) -> QuotaPolicy:
        """The policy as the pure engine takes it."""
        return QuotaPolicy(
            headroom=self.headroom,
            floor=self.floor,
            hysteresis=self.hysteresis,
            lower_after_seconds=self.lower_after_seconds,
        )

    def flavor_models(self) -> tuple[Flavor, ...]:
        """The flavors as the pure engine takes them."""
        return tuple(Flavor(name=f.name, node_labels=dict(f.node_labels)) for f in self.flavors)


class ProviderSettings(_Group):
    """One provider support intake (webhook)."""

    name: str
    url: str
    template: RequiredTemplateName = Field(
        "generic.json.j2", description="Template name: a built-in or a file in tickets.templates_dir."
    )
    secret_env: str | None = Field(None, description="Environment variable holding the HMAC secret.")
    secret_file: Path | None = Field(None, description="File holding the HMAC secret (Secret mount).")
    timeout_seconds: float = Field(10.0, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)
    escalation_template: TemplateName = None
    escalation_provider: str | None = None
    ack_within_seconds: float | None = Field(
        None,
        gt=0,
        description=(
            "Repair target: the provider acknowledges a ticket within this many seconds of its "
            "delivery; past it the ticket is flagged overdue and escalated once (unset: no target)."
        ),
    )
    repair_within_seconds: float | None = Field(
        None,
        gt=0,
        description=(
            "Repair target: the provider resolves a ticket within this many seconds of its delivery; "
            "past it the ticket is flagged overdue and escalated once (unset: no target)."
        ),
    )
    callback_secret_env: str | None = Field(
        None, description="Env var with this provider's status-callback HMAC secret."
    )
    callback_secret_file: Path | None = Field(
        None, description="File with this provider's status-callback HMAC secret (Secret mount)."
    )


class TicketSettings(_Group):
    """Provider tickets."""

    cluster_name: str = "local"
    dashboard_url: str = "http://127.0.0.1:8080"
    providers: list[ProviderSettings] = Field(default_factory=list)
    templates_dir: Path | None = Field(
        None,
        description="Directory of your own ticket templates, referred to by file name (never by path).",
    )
    repeat_window_days: int = Field(
        30, ge=0, description="A failure within this many days of a repair escalates."
    )
    callback_secret_env: str | None = Field(
        None,
        description="Env var with a callback HMAC secret shared by the providers that set none of "
        "their own (unset: such providers' callbacks are refused).",
    )
    callback_secret_file: Path | None = None
    max_clock_skew_seconds: int = Field(
        300, ge=1, description="Inbound callbacks older or newer are refused."
    )

    @field_validator("providers")
    @classmethod
    def _unique_names(cls, value: list[ProviderSettings]) -> list[ProviderSettings]:
        names = [p.name for p in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate provider names: {', '.join(dupes)}")
        return value


class RepairSettings(_Group):
    """Remediation ladders' repairs (GPU reset, node reboot) by the node agent (``healer agent``),
    and the log bundle it captures for a replacement ticket (``capture_wait_seconds``).

    The controller signs each request (HMAC-SHA256 with the secret, mounted from a Secret into both
    the controller and the agent) and publishes it on the Node; see ``healer.model.repair``.
    """

    actions: list[Literal["reset-gpu", "reboot"]] = Field(
        default_factory=list,
        description=(
            "Repairs a node agent (or a provider API) carries out here. Empty (default): ladders "
            "skip reset-gpu and reboot (recorded) and go on to their ticket."
        ),
    )
    secret_env: str | None = Field(None, description="Env var holding the request-signing secret.")
    secret_file: Path | None = Field(
        None, description="File holding the request-signing secret (Secret mount)."
    )
    request_ttl_seconds: float = Field(
        600.0, gt=0, description="A request expires this long after it is made, seconds."
    )
    xid_catalog: Path | None = Field(
        None,
        description=(
            "Xid catalog giving the default ladders' classes; unset = catalog/xid-catalog.yaml in "
            "the first rules path, when there (else every Xid is class unknown: ticket)."
        ),
    )
    agent_commands: dict[str, list[str]] = Field(
        default_factory=lambda: {
            "reset-gpu": ["nvidia-smi", "-r", "-i", "{gpu}"],
            "reboot": ["systemctl", "reboot"],
        },
        description="The agent's command per action ({gpu} is the GPU index); exit 0 = succeeded.",
    )
    agent_executor: str | None = Field(
        None,
        description="'module:factory' of another executor (a provider's API) instead of the commands.",
    )
    agent_command_timeout_seconds: float = Field(300.0, gt=0)
    agent_bundle_command: list[str] = Field(
        default_factory=lambda: ["nvidia-smi", "-q"],
        description=(
            "The command whose output the node agent adds to the log bundle it captures before a "
            "reboot or for a ticket (with the kernel log and its Xid lines); empty: none. The chart "
            "runs it on the host through nsenter."
        ),
    )
    capture_wait_seconds: float = Field(
        60.0,
        ge=0,
        description=(
            "With repair.actions set (a node agent answers), quarantining a node also asks its "
            "agent for the log bundle; a replacement ticket waits for the answer at most this long "
            "after the request, seconds, then goes without it (the payload says why). 0: no "
            "capture is asked."
        ),
    )

    @model_validator(mode="after")
    def _secret_when_acting(self) -> RepairSettings:
        if self.actions and not (self.secret_env or self.secret_file):
            raise ValueError(
                "repair.actions needs repair.secret_env or repair.secret_file (requests are signed)"
            )
        return self


class ValidationSettings(_Group):
    """The validation Job run on a repaired node before it returns (``healer.actions.validation``).

    Its container's last line of termination message is a JSON result (``healer.model.validation``).
    """

    enabled: bool = Field(False, description="Gate every return to service on a validation Job.")
    namespace: str = Field("healer-system", description="Namespace of the validation Jobs.")
    image: str = Field(
        "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04", description="An image with dcgmi."
    )
    command: list[str] = Field(
        default_factory=lambda: [
            "/bin/sh",
            "-c",
            "dcgmi diag -r {level} > /tmp/diag.txt 2>&1; rc=$?; "
            "if [ $rc = 0 ]; then p=true; else p=false; fi; "
            'printf \'{"dcgm_level": {level}, "passed": %s, "exit_code": %s}\\n\' $p $rc '
            "> /dev/termination-log; exit $rc",
        ],
        description="The command ({level}: dcgm_level); it writes a JSON line to /dev/termination-log.",
    )
    dcgm_level: int = Field(2, ge=1, le=4, description="DCGM diagnostics level (dcgmi diag -r).")
    nccl_min_busbw_gbps: float | None = Field(
        None, gt=0, description="Fail when the result's nccl_busbw_gbps is under it, GB/s (None: unchecked)."
    )
    timeout_seconds: int = Field(3600, ge=60, description="The Job's activeDeadlineSeconds.")
    gpu_resource: str = Field(
        "nvidia.com/gpu", description="The extended resource requested (all the node has)."
    )


TaintEffectName = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class DomainKindSettings(_Group):
    """One kind of domain (:mod:`healer.engine.correlation`): where a node's domain is read, when
    bad nodes in it are one domain fault, and where the domain's ticket goes.

    The thresholds' defaults (per kind, below) rest on one argument: independent node faults in a
    domain are rare (a few per node per year), so several in one domain within minutes are one
    cause; a storm from one part (a switch, a rack's power or cooling) reaches its nodes within a
    minute or two, plus a scrape interval and the 5-minute rate windows of the InfiniBand and
    NVLink rules, hence a 300 s window.
    """

    enabled: bool = Field(True, description="Correlate this kind (False: its domains are ignored).")
    labels: list[str] = Field(
        default_factory=list,
        description="Node labels naming the node's domain of this kind, first present wins.",
    )
    min_nodes: int = Field(
        3, ge=2, description="Bad nodes that make a domain fault (count; 1 is a node fault)."
    )
    min_percent: float = Field(
        10.0, ge=0, le=100, description="... and at least this % of the domain's nodes."
    )
    window_seconds: float = Field(
        300.0, gt=0, description="Their first-seen times within this many seconds of each other."
    )
    rules: list[str] = Field(
        default_factory=list,
        description="Only findings of these rules count (empty: every rule that quarantines or taints).",
    )
    provider: str = Field("default", description="The ticket provider of this kind's domain tickets.")
    template: TemplateName = Field(
        None, description="Template override for the domain ticket (None: the provider's)."
    )
    taint_effect: TaintEffectName = Field(
        "NoSchedule",
        description="The effect of healer's taint on the domain's nodes (not cordoned, not drained).",
    )


class RackSettings(DomainKindSettings):
    """A rack (power, cooling, top-of-rack): an HGX rack holds 4-8 nodes, an NVL72 rack 18; 3
    nodes and a quarter of the rack at once is not chance."""

    labels: list[str] = Field(default_factory=lambda: ["topology.healer.dev/rack"])
    min_nodes: int = Field(3, ge=2)
    min_percent: float = Field(25.0, ge=0, le=100)


class IbLeafSettings(DomainKindSettings):
    """An InfiniBand leaf switch: up to 64 ports (NVIDIA Quantum-2 QM9700, 64 NDR ports); 3 nodes
    and 10 % of those behind it (16 of 64 is 25 %)."""

    labels: list[str] = Field(default_factory=lambda: ["topology.healer.dev/ib-leaf"])


class IbSpineSettings(DomainKindSettings):
    """An InfiniBand spine switch: many leaves' nodes; 4 nodes and 10 % of them."""

    labels: list[str] = Field(default_factory=lambda: ["topology.healer.dev/ib-spine"])
    min_nodes: int = Field(4, ge=2)


class NvlinkSettings(DomainKindSettings):
    """An NVLink domain (NVL72: 18 compute trays sharing NVSwitch trays), read from GPU Feature
    Discovery's ``nvidia.com/gpu.clique`` (``<cluster UUID>.<clique id>``); 3 trays and 15 %."""

    labels: list[str] = Field(default_factory=lambda: ["nvidia.com/gpu.clique"])
    min_percent: float = Field(15.0, ge=0, le=100)


class ZoneSettings(DomainKindSettings):
    """A zone (``topology.kubernetes.io/zone``): off by default, a zone outage is the breaker's."""

    enabled: bool = Field(False)
    labels: list[str] = Field(default_factory=lambda: ["topology.kubernetes.io/zone"])
    min_nodes: int = Field(8, ge=2)
    min_percent: float = Field(25.0, ge=0, le=100)


class TopologySettings(_Group):
    """Domains of nodes that fail together (docs/topology.md): k of n nodes of one domain bad
    within a window are one domain incident, one ticket to the domain's queue."""

    enabled: bool = Field(True, description="Correlate findings by domain (no labels, no domains).")
    file: Path | None = Field(
        None,
        description="YAML {nodes: {node: {kind: domain}}} for what the labels do not carry (labels win).",
    )
    nvlink: NvlinkSettings = Field(default_factory=NvlinkSettings)
    rack: RackSettings = Field(default_factory=RackSettings)
    ib_leaf: IbLeafSettings = Field(default_factory=IbLeafSettings)
    ib_spine: IbSpineSettings = Field(default_factory=IbSpineSettings)
    zone: ZoneSettings = Field(default_factory=ZoneSettings)

    def kinds(self) -> dict[str, DomainKindSettings]:
        """The enabled kinds, most specific first (the order that breaks ties between domains)."""
        every: dict[str, DomainKindSettings] = {
            "nvlink": self.nvlink,
            "rack": self.rack,
            "ib_leaf": self.ib_leaf,
            "ib_spine": self.ib_spine,
            "zone": self.zone,
        }
        return {kind: k for kind, k in every.items() if k.enabled} if self.enabled else {}


class ApiToken(_Group):
    """A bearer token and the role it grants. Give the token through the environment, not a file in git."""

    token: str = Field(..., min_length=16)
    user: str
    role: Literal["viewer", "operator"] = "viewer"


class ApiSettings(_Group):
    """The dashboard and JSON API."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    tokens: list[ApiToken] = Field(default_factory=list)
    proxy_user_header: str | None = Field(None, description="e.g. X-Forwarded-User from oauth2-proxy.")
    proxy_groups_header: str | None = Field(None, description="e.g. X-Forwarded-Groups (comma separated).")
    operator_groups: list[str] = Field(default_factory=list, description="Proxy groups granted operator.")
    anonymous_role: Literal["none", "viewer", "operator"] = Field(
        "none", description="Role of requests with no token and no proxy identity (none: refused)."
    )
    csrf_secret: str | None = Field(None, description="Unset = a random secret per process.")
    max_body_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Largest request body, bytes, on every route (413 above, checked before reading): "
        "callbacks, forms and JSON operations are a few kilobytes.",
    )
    refresh_seconds: float = Field(
        15.0, ge=2, description="The fleet page refreshes its content this often, seconds (no full reload)."
    )
    awaiting_repair_attention_hours: float = Field(
        24.0, gt=0, description="A node awaiting repair longer than this is listed under Needs attention."
    )
    recent_incidents_hours: float = Field(
        24.0,
        ge=0,
        description="The fleet page lists incidents closed within this many hours (0: none), so a "
        "night's incidents stay in sight after they close.",
    )
    prometheus_link_url: str | None = Field(
        None,
        description="Base URL of the Prometheus UI for the node page's 'open in Prometheus' links; "
        "unset: prometheus.url when it carries no credentials, else no link.",
    )
    grafana_url: str | None = Field(
        None, description="Grafana base URL for 'open in Grafana Explore' links (unset: no link)."
    )
    grafana_datasource: str | None = Field(
        None, description="UID of the Grafana Prometheus data source those links use."
    )


class Settings(BaseSettings):
    """All of healer's settings. Build with :func:`load_settings`."""

    model_config = SettingsConfigDict(env_prefix="HEALER_", env_nested_delimiter="__", extra="forbid")

    rules_paths: list[Path] = Field(default_factory=lambda: [Path("rules")])
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    detection: DetectionSettings = Field(default_factory=DetectionSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    safety: SafetySettings = Field(default_factory=SafetySettings)
    tickets: TicketSettings = Field(default_factory=TicketSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    repair: RepairSettings = Field(default_factory=RepairSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    kueue: KueueSettings = Field(default_factory=KueueSettings)
    gpu_isolation: GpuIsolationSettings = Field(default_factory=GpuIsolationSettings)
    infiniband: InfinibandSettings = Field(default_factory=InfinibandSettings)
    topology: TopologySettings = Field(default_factory=TopologySettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if settings_cls.model_config.get("yaml_file"):
            sources.append(YamlConfigSettingsSource(settings_cls))
        return tuple(sources)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings once.

    Args:
        config_file: optional YAML file (the CLI's ``--config``).
        overrides: highest-priority values (tests, CLI flags).

    Raises:
        ConfigError: the file is missing or a value is invalid; the message names each field.
    """
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"{config_file}: config file not found")
    _check_environment(os.environ)
    cls = Settings
    if config_file is not None:
        _check_yaml(config_file)
        # A subclass carries the file in its config, so no module state is needed.
        cls = cast(
            type[Settings],
            type(
                "Settings", (Settings,), {"model_config": {**Settings.model_config, "yaml_file": config_file}}
            ),
        )
    try:
        return cls(**overrides)
    except ValidationError as exc:
        where = str(config_file) if config_file else "settings"
        environment = {key.upper() for key in os.environ}
        lines = []
        for err in exc.errors():
            loc = [str(p) for p in err["loc"]]
            # The environment wins over the file: a bad value set there is named by its variable.
            variable = "HEALER_" + "__".join(loc).upper()
            source = variable if loc and loc[0] not in overrides and variable in environment else where
            lines.append(f"{source}: {'.'.join(loc) or '(root)'}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from exc


def _check_environment(environ: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError` naming each ``HEALER_<GROUP>__<FIELD>`` variable whose group is
    not a settings group (pydantic-settings ignores it silently: a misspelt ``HEALER_SAFTEY__DRY_RUN``
    would leave dry-run on without a word), with the nearest group. Variables without ``__``
    (``HEALER_CONFIG``, ``HEALER_LOG_LEVEL`` ...) are not settings and are left alone."""
    groups = sorted(Settings.model_fields)
    wrong = []
    for key in sorted(environ):
        name = key.upper()
        if not name.startswith("HEALER_") or "__" not in name:
            continue
        group = name.removeprefix("HEALER_").split("__", 1)[0].lower()
        if group not in Settings.model_fields:
            near = difflib.get_close_matches(group, groups, n=1)
            hint = (
                f" (did you mean HEALER_{near[0].upper()}__...?)"
                if near
                else f" (groups: {', '.join(groups)})"
            )
            wrong.append(f"{key}: no settings group '{group}'{hint}")
    if wrong:
        raise ConfigError("\n".join(wrong))


def _check_yaml(config_file: Path) -> None:
    """Raise :class:`ConfigError` naming the file (and line:column when YAML gives one) unless it is
    YAML whose top level is a mapping of settings (or empty)."""
    reader = YAML(typ="safe", pure=True)
    reader.allow_duplicate_keys = True  # as the settings loader (PyYAML): the last one wins
    try:
        data = reader.load(config_file.read_text(encoding="utf-8"))
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{config_file}:{mark.line + 1}:{mark.column + 1}" if mark else str(config_file)
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        context = f" ({context})" if context else ""
        raise ConfigError(f"{where}: not valid YAML: {problem}{context}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{config_file}: cannot read: {exc}") from exc
    if data is not None and not isinstance(data, dict):
        raise ConfigError(
            f"{config_file}: the top level must be a mapping of settings (e.g. 'prometheus: ...'), "
            f"not a {type(data).__name__}"
        )
