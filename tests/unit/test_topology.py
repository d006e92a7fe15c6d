"""The topology from node labels and the topology file (healer.topology): labels win, the file
fills in, a bad file names itself and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from healer.config import Settings
from healer.errors import ConfigError
from healer.topology import build, load_file

SETTINGS = Settings().topology
KINDS = frozenset(SETTINGS.kinds())


def test_labels_name_the_domains_and_the_file_fills_in_what_they_lack(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text("nodes:\n  n1: {ib_leaf: leaf-from-file, ib_spine: spine-1}\n  n3: {rack: r9}\n")
    labels = {
        "n1": {"topology.healer.dev/ib-leaf": "leaf-7", "nvidia.com/gpu.clique": "uuid.3"},
        "n2": {"kubernetes.io/hostname": "n2"},
        "n3": {},
    }
    topology = build(labels, SETTINGS, file_map=load_file(path, KINDS))
    assert topology == {
        "n1": {"nvlink": "uuid.3", "ib_leaf": "leaf-7", "ib_spine": "spine-1"},
        "n3": {"rack": "r9"},
    }


def test_a_disabled_kind_is_not_read() -> None:
    labels = {"n1": {"topology.kubernetes.io/zone": "z1", "topology.healer.dev/rack": "r1"}}
    assert build(labels, SETTINGS) == {"n1": {"rack": "r1"}}  # zone is off by default
    on = SETTINGS.model_copy(update={"zone": SETTINGS.zone.model_copy(update={"enabled": True})})
    assert build(labels, on) == {"n1": {"rack": "r1", "zone": "z1"}}
    off = SETTINGS.model_copy(update={"enabled": False})
    assert build(labels, off) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: [a, b]\n", "topology.yaml: nodes: Input should be a valid dictionary"),
        ("nodes:\n  n1: {switch: s1}\n", "topology.yaml: nodes.n1.switch: not a domain kind"),
        ("nodes:\n  n1: {rack: [r1]}\n", "topology.yaml: nodes.n1.rack: Input should be a valid string"),
        ("nodes: {n1: {rack: r1}\n", "topology.yaml:2:1: not valid YAML"),
        ("racks: {}\n", "topology.yaml: racks: Extra inputs are not permitted"),
    ],
)
def test_a_bad_topology_file_names_the_file_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_file(path, KINDS)
    assert message in str(raised.value)
