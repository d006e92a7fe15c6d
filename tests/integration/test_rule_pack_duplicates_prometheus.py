"""No rule of the default pack counts a copy (issue 25): every rule, fed its input twice, answers
exactly what it answers fed once, on a real Prometheus.

The inputs are the pack's own rule tests (``rules/tests/*.yaml``: a test for every rule, with the
faults that make it fire). Each test's series are laid out once as written (the single shape) and
once per duplicate shape, every shape on its own day, all served by one throwaway Prometheus
(:mod:`healer.sources.scratch`). Every rule of the test's rule files is then evaluated at every
tick of the test (its ``evaluation_interval``), and each shape's result, labels and values, must be
the single shape's.

The shapes are the ways one physical counter or gauge arrives as several series (rules/README.md,
"Copies of one series"):

- **two dcgm-exporters** on a node (the GPU Operator's and a Helm chart's): every ``DCGM_*`` series
  twice, from two exporter pods (``instance``, ``namespace``, ``pod``, ``container``), as a
  ServiceMonitor with ``honor_labels: false`` labels them (``healer_dev.simulator``'s ``exported``
  style); node_exporter scraped by two jobs (a ServiceMonitor and an annotation-based job): every
  ``node_*`` series twice, ``job`` apart;
- **a GPU shared by two pods** (time-slicing, MPS, DRA): dcgm-exporter emits one series per pod per
  GPU, same ``gpu``/``UUID``, workload ``pod``/``namespace``/``container`` apart
  (rules/README.md, "What each rule's result carries"; tests/integration/test_exporter_shapes_prometheus.py);
- **a restarted exporter** whose new pod reports before the old one is gone (a surge rollout): the
  new pod's copy starts half-way through the test and overlaps the old one to the end. dcgm's
  copies differ in ``instance`` and ``pod`` (a pod IP each); node_exporter runs on the host network,
  so its copies (``up`` too) keep ``instance`` and differ in ``pod``.

Copies under another ``instance`` of node_exporter are not a shape here: the InfiniBand rules keep
``instance`` (it names the node when no node label is relabeled on), so such copies are two
findings of one port, each with the port's true count, never a sum.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from healer.ruleset.inputs import metric_names
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import Rule
from healer.ruletest import spec as rule_tests
from healer.ruletest.series import Series, openmetrics
from healer.sources.history import history_ticks
from healer.sources.prometheus_range import PrometheusRange
from healer.sources.scratch import scratch_prometheus
from tests.conftest import REPO

pytestmark = pytest.mark.prometheus

DAY = 86400.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Labels = dict[str, str]


@dataclass(frozen=True)
class Shape:
    """How one series arrives twice: the labels each copy gets, per exporter (``dcgm``: the
    ``DCGM_*`` families; ``node``: node_exporter's); ``up``: the target's ``up`` copied too (one
    target whose pod changed; two exporters are two targets, each with its own ``up``);
    ``late``: the second copy starts half-way through (a restarted exporter's new pod)."""

    name: str
    dcgm: tuple[Labels, Labels] | None
    node: tuple[Labels, Labels] | None
    up: tuple[Labels, Labels] | None = None
    late: bool = False

    def _pair(self, family: str) -> tuple[Labels, Labels] | None:
        if family.startswith("DCGM_"):
            return self.dcgm
        return self.up if family == "up" else self.node

    def copies(self, series: Series) -> list[Series]:
        pair = self._pair(series.name)
        if pair is None:
            return [series]
        out = []
        for i, extra in enumerate(pair):
            values = series.values
            if self.late and i == 1:
                half = len(values) // 2
                values = (None,) * half + values[half:]
            labels = tuple(sorted({**series.label_map(), **extra}.items()))
            out.append(replace(series, labels=labels, values=values))
        return out

    def copies_any(self, families: set[str]) -> bool:
        return any(self._pair(f) is not None for f in families)


def _dcgm_pod(ip: str, namespace: str, pod: str) -> Labels:
    """The target labels of one dcgm-exporter pod (a pod IP each)."""
    return {"instance": f"{ip}:9400", "namespace": namespace, "pod": pod, "container": "nvidia-dcgm-exporter"}


#: The GPU Operator's exporter pod, in every shape that has exporter pods.
OPERATOR_POD = _dcgm_pod("10.244.3.17", "gpu-operator", "nvidia-dcgm-exporter-7xk2p")
NODE_EXPORTER_PODS = ({"pod": "node-exporter-8hq2v"}, {"pod": "node-exporter-zr6kd"})

SHAPES = (
    Shape(
        "two exporters",
        dcgm=(OPERATOR_POD, _dcgm_pod("10.244.3.40", "monitoring", "dcgm-exporter-q9z4m")),
        node=({"job": "node-exporter"}, {"job": "kubernetes-pods"}),
    ),
    Shape(
        "GPU shared by two pods",
        dcgm=(
            {"namespace": "ml", "pod": "train-0", "container": "trainer"},
            {"namespace": "ml", "pod": "infer-5d8f", "container": "server"},
        ),
        node=None,
    ),
    Shape(
        "restarted exporter",
        dcgm=(OPERATOR_POD, _dcgm_pod("10.244.3.52", "gpu-operator", "nvidia-dcgm-exporter-m4w8t")),
        node=NODE_EXPORTER_PODS,
        up=NODE_EXPORTER_PODS,
        late=True,
    ),
)
SINGLE = Shape("single", dcgm=None, node=None)

#: One tick of one rule: its result series as (sorted labels, value).
Result = frozenset[tuple[tuple[tuple[str, str], ...], float]]


@dataclass(frozen=True)
class Slot:
    spec: rule_tests.TestFile
    test: rule_tests.TestCase
    shape: Shape
    start: float  # seconds since the epoch


def _slots() -> list[Slot]:
    slots: list[Slot] = []
    offset = 0.0
    for path in sorted((REPO / "rules" / "tests").glob("*.yaml")):
        spec = rule_tests.load(path)
        for test in spec.tests:
            span = max(test.end, max(len(s.values) for s in test.series) * test.interval)
            for shape in (SINGLE, *SHAPES):
                slots.append(Slot(spec, test, shape, offset))
                offset += math.ceil((span + DAY) / DAY) * DAY
    return slots


def _rules_of(spec: rule_tests.TestFile) -> list[Rule]:
    return list(load_ruleset([Path(p) for p in spec.rule_files]).rules)


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str, str], list[Result]]:
    """(rule, test, shape) → the rule's result at every tick of the test."""
    slots = _slots()
    text = openmetrics(
        (copy, slot.start, slot.test.interval)
        for slot in slots
        for series in slot.test.series
        for copy in slot.shape.copies(series)
    )
    out: dict[tuple[str, str, str], list[Result]] = {}
    with scratch_prometheus(text) as url:
        source = PrometheusRange(url, timeout_seconds=30.0)
        for slot in slots:
            rules = _rules_of(slot.spec)
            start = _EPOCH + timedelta(seconds=slot.start)
            ticks = history_ticks(
                source,
                {r.name: r.expr for r in rules},
                start=start,
                end=start + timedelta(seconds=slot.test.end),
                step_seconds=slot.spec.evaluation_interval,
            )
            for _, by_rule in ticks:
                for rule, result in by_rule.items():
                    assert not isinstance(result, Exception), (rule, result)
                    got = frozenset((tuple(sorted(s.labels.items())), s.value) for s in result.samples)
                    out.setdefault((rule, slot.test.name, slot.shape.name), []).append(got)
    return out


def _pairs() -> Iterator[tuple[str, Shape]]:
    pack = load_ruleset([REPO / "rules"]).rules
    for rule in pack:
        families = metric_names([rule.expr])
        for shape in SHAPES:
            if shape.copies_any(families):
                yield rule.name, shape


PAIRS = list(_pairs())


@pytest.mark.parametrize(("rule", "shape"), PAIRS, ids=[f"{r}-{s.name}" for r, s in PAIRS])
def test_a_copied_input_gives_the_findings_of_the_single_input(
    results: dict[tuple[str, str, str], list[Result]], rule: str, shape: Shape
) -> None:
    tests = sorted({t for (r, t, s) in results if r == rule and s == SINGLE.name})
    # Every rule has a test that makes it return something: else this comparison could not fail.
    assert any(any(tick) for t in tests for tick in results[(rule, t, SINGLE.name)]), rule
    for test in tests:
        single, copied = results[(rule, test, SINGLE.name)], results[(rule, test, shape.name)]
        for i, (want, got) in enumerate(zip(single, copied, strict=True)):
            assert got == want, f"{rule}, {test!r}, tick {i}: copied {sorted(got)}, once {sorted(want)}"
