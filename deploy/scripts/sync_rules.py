#!/usr/bin/env python3
"""Copy what the Helm chart ships from the repository into the chart: the rule pack, the Xid catalog
and the counters.

Helm reads files (``.Files.Glob``) only from inside the chart, so ``rules/*.yaml`` are copied to
``deploy/chart/healer/files/rules/`` (ConfigMap ``<release>-rules``),
``rules/catalog/xid-catalog.yaml`` to ``deploy/chart/healer/files/catalog/`` (ConfigMap
``<release>-xid-catalog``, which the default ladders read: ``repair.xid_catalog``) and
``deploy/dcgm-exporter/counters-<line>.csv`` to ``deploy/chart/healer/files/dcgm-metrics-<line>.csv``
(the optional dcgm-exporter ConfigMap; ``dcgmExporterCounters.exporterLine`` picks one).
tests/integration/test_deploy_manifests.py fails when a copy no longer matches.

Usage: ``python deploy/scripts/sync_rules.py`` (write) or ``... --check`` (exit 1 when stale).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "rules"
XID_CATALOG = RULES_DIR / "catalog" / "xid-catalog.yaml"
COUNTERS_DIR = REPO / "deploy" / "dcgm-exporter"
#: One counters CSV per dcgm-exporter line (they name field 112 differently; see deploy/README.md).
EXPORTER_LINES = ("3.x", "4.x")
CHART_FILES = REPO / "deploy" / "chart" / "healer" / "files"


def rule_files(rules_dir: Path = RULES_DIR) -> dict[str, str]:
    """The rule pack: file name -> text (``*.yaml``/``*.yml`` directly in ``rules_dir``)."""
    files = sorted(p for p in rules_dir.iterdir() if p.is_file() and p.suffix in {".yaml", ".yml"})
    return {p.name: p.read_text(encoding="utf-8") for p in files}


def wanted() -> dict[Path, str]:
    """Every file the chart's ``files/`` must hold, with its text."""
    out = {CHART_FILES / "rules" / name: text for name, text in rule_files().items()}
    out[CHART_FILES / "catalog" / XID_CATALOG.name] = XID_CATALOG.read_text(encoding="utf-8")
    for line in EXPORTER_LINES:
        csv = COUNTERS_DIR / f"counters-{line}.csv"
        out[CHART_FILES / f"dcgm-metrics-{line}.csv"] = csv.read_text(encoding="utf-8")
    return out


def stale() -> list[str]:
    """Chart files that differ from the repository's, are missing, or are left over (relative paths)."""
    want = wanted()
    present = {p for d in ("rules", "catalog") for p in (CHART_FILES / d).glob("*") if p.is_file()}
    present |= set(CHART_FILES.glob("dcgm-metrics*.csv"))
    problems = [p for p, text in want.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    problems += sorted(present - set(want))
    return [str(p.relative_to(REPO)) for p in problems]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        problems = stale()
        for path in problems:
            print(f"{path} is stale: run python deploy/scripts/sync_rules.py")
        return 1 if problems else 0
    want = wanted()
    for sub in ("rules", "catalog"):
        (CHART_FILES / sub).mkdir(parents=True, exist_ok=True)
    copies = [*(CHART_FILES / "rules").glob("*"), *(CHART_FILES / "catalog").glob("*")]
    for path in [*copies, *CHART_FILES.glob("dcgm-metrics*.csv")]:
        if path not in want:
            path.unlink()
    for path, text in want.items():
        path.write_text(text, encoding="utf-8")
    print(f"wrote {len(want)} files under {CHART_FILES.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
