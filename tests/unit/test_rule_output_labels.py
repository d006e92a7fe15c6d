"""A rule whose expression certainly keeps no node label is told apart from one that may keep one
(:mod:`healer.ruleset.output_labels`): warn only when sure."""

from __future__ import annotations

import pytest

from healer.ruleset.output_labels import node_blind
from healer.ruleset.schema import DEFAULT_NODE_LABELS

BLIND = [
    ("sum by (gpu) (DCGM_FI_DEV_GPU_TEMP) > 80", "keeps only (gpu)"),
    ("sum(DCGM_FI_DEV_GPU_TEMP) > 80", "keeps no label"),
    ("(max by (gpu) (rate(x[5m]))) > 0", "keeps only (gpu)"),
    ("sum by (gpu) (x) and on (gpu) y", "keeps only (gpu)"),
    (
        "sum without (Hostname, hostname, node, kubernetes_node, nodename, instance) (x) > 1",
        "drops (Hostname, hostname, instance, kubernetes_node, node, nodename)",
    ),
]

SIGHTED = [
    "max by (Hostname, gpu) (x) > 78",
    "sum by (instance) (x) > 1",
    "sum without (Hostname) (x) > 1",
    "rate(x[5m]) > 0",
    "x > 1",
    'label_replace(sum by (gpu) (x), "node", "n1", "gpu", "(.*)")',
    "sum by (gpu) (x) or max by (Hostname) (y)",
    "sum by (gpu) (x) * on (gpu) group_left (Hostname) y",
    "topk by (gpu) (1, x)",
    "absent(x)",
    "x >",  # does not parse: promtool reports it, not this check
]


@pytest.mark.parametrize(("expr", "words"), BLIND)
def test_an_expression_that_certainly_drops_every_node_label_is_named(expr: str, words: str) -> None:
    blind = node_blind(expr, DEFAULT_NODE_LABELS)
    assert blind is not None
    text = str(blind)
    assert words in text
    assert "(Hostname, hostname, node, kubernetes_node, nodename, instance)" in text


@pytest.mark.parametrize("expr", SIGHTED)
def test_an_expression_that_may_keep_a_node_label_is_not(expr: str) -> None:
    assert node_blind(expr, DEFAULT_NODE_LABELS) is None


def test_the_rules_own_node_labels_are_what_counts() -> None:
    assert node_blind("sum by (host) (x) > 1", ["host"]) is None
    blind = node_blind("sum by (host) (x) > 1", ["machine"])
    assert blind is not None
    assert "(machine, instance)" in str(blind)
