"""The fleet's topology: each node's domain of each kind (rack, InfiniBand leaf and spine switch,
NVLink domain, zone), from its labels and an optional topology file (docs/topology.md).

The file fills in what labels do not carry (a switch map produced from ``ibnetdiscover``, say)::

    nodes:
      gpu-001: {rack: r12, ib_leaf: leaf-07, ib_spine: spine-1}

A label on the node wins over the file. Kinds are those of ``topology`` in the settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from healer.config import TopologySettings
from healer.engine.correlation import Threshold, Topology
from healer.errors import ConfigError


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: dict[str, dict[str, str]] = {}


def load_file(path: Path, kinds: frozenset[str]) -> dict[str, dict[str, str]]:
    """The topology file's ``nodes`` map (node → {kind: domain}).

    Raises:
        ConfigError: unreadable, not YAML, not the shape above, or a kind not in ``kinds``; the
            message names the file (and line:column, or the field).
    """
    reader = YAML(typ="safe", pure=True)
    try:
        data = reader.load(path.read_text(encoding="utf-8"))
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    try:
        parsed = _File.model_validate(data or {})
    except ValidationError as exc:
        lines = [f"{path}: {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from exc
    for node, domains in parsed.nodes.items():
        for kind in domains:
            if kind not in kinds:
                raise ConfigError(
                    f"{path}: nodes.{node}.{kind}: not a domain kind (kinds: {', '.join(sorted(kinds))})"
                )
    return parsed.nodes


def build(
    labels: Mapping[str, Mapping[str, str]],
    settings: TopologySettings,
    *,
    file_map: Mapping[str, Mapping[str, str]] | None = None,
) -> Topology:
    """node → {kind: domain} for the nodes in ``labels`` (node → its Kubernetes labels): for each
    enabled kind, the first of its ``labels`` the node carries, else the file's entry."""
    kinds = settings.kinds()
    out: dict[str, dict[str, str]] = {}
    for node, node_labels in labels.items():
        from_file = (file_map or {}).get(node, {})
        domains: dict[str, str] = {}
        for kind, kind_settings in kinds.items():
            name = next((node_labels[k] for k in kind_settings.labels if node_labels.get(k)), None)
            name = name or from_file.get(kind)
            if name:
                domains[kind] = name
        if domains:
            out[node] = domains
    return out


def thresholds(settings: TopologySettings) -> dict[str, Threshold]:
    """The enabled kinds' thresholds, as :func:`healer.engine.correlation.correlate` takes them."""
    return {
        kind: Threshold(k.min_nodes, k.min_percent, k.window_seconds, frozenset(k.rules))
        for kind, k in settings.kinds().items()
    }
