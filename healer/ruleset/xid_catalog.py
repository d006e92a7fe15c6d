"""The Xid catalog (``rules/catalog/xid-catalog.yaml``): Xid code → class, with its source.

The default rule pack's Xid rules are written from it; ``render_value_match`` and
``render_label_regex`` give the PromQL fragments the rules must carry, so a test can tell when the
rules and the catalog disagree. Classes (what the node needs):

- ``fatal-replace``: the GPU is damaged (replace it);
- ``reboot``: only a node reboot clears it;
- ``reset``: a GPU reset clears it;
- ``application``: the workload's own fault, not the node's;
- ``unknown``: any code not in the catalog ("contact support", as NVIDIA NVSentinel does).

``corroborate`` marks codes whose number alone cannot tell fatal from benign (NVLink5 Xids 144-150:
the severity is in a sub-code dcgm-exporter does not expose); the pack acts on them only with
corroboration (repeats, NVLink error counters).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from ruamel.yaml import YAML

XidClass = Literal["fatal-replace", "reboot", "reset", "application"]

#: Classes whose Xid takes the node out of service (quarantine, drain, ticket).
ACTIONABLE: tuple[XidClass, ...] = ("fatal-replace", "reboot", "reset")


class XidEntry(BaseModel):
    """One Xid code: its class, a short meaning, the key of its source in ``sources``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: int = Field(..., ge=1)
    xid_class: XidClass = Field(..., alias="class")
    name: str = Field(..., min_length=1)
    source: str = Field(..., min_length=1)
    corroborate: bool = False


class XidCatalog(BaseModel):
    """The catalog: ``sources`` (key → citation) and one entry per code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sources: dict[str, str]
    xids: tuple[XidEntry, ...]

    @model_validator(mode="after")
    def _consistent(self) -> XidCatalog:
        codes = [x.code for x in self.xids]
        if len(codes) != len(set(codes)):
            raise ValueError("a Xid code is listed twice")
        unknown = {x.source for x in self.xids} - set(self.sources)
        if unknown:
            raise ValueError(f"entries cite sources not in `sources`: {sorted(unknown)}")
        return self

    def codes(self, *classes: XidClass, corroborate: bool | None = None) -> list[int]:
        """Sorted codes of ``classes`` (all classes when none given); ``corroborate`` filters by flag."""
        return sorted(
            x.code
            for x in self.xids
            if (not classes or x.xid_class in classes)
            and (corroborate is None or x.corroborate == corroborate)
        )

    def classify(self, code: int) -> XidClass | Literal["unknown"]:
        """The class of Xid ``code``; ``unknown`` when the catalog does not list it."""
        return next((x.xid_class for x in self.xids if x.code == code), "unknown")


def load_xid_catalog(path: Path) -> XidCatalog:
    """Read the catalog YAML. Raises ``pydantic.ValidationError`` on a malformed entry."""
    data = YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))
    return XidCatalog.model_validate(data)


def render_value_match(metric: str, codes: Iterable[int]) -> str:
    """PromQL keeping the series of ``metric`` whose value is one of ``codes`` (integers).

    ``DCGM_FI_DEV_XID_ERRORS`` holds the last Xid as its value, and PromQL cannot match a value
    against a set. A chain of filters on ONE selection does it: ``metric >= lo <= hi`` keeps the
    span of the codes, then ``!= n`` drops each integer of the span that is not a code. Each
    comparison filters the previous result (values kept, labels kept), so the answer is that of
    the ``or`` of one comparison per code, which selected the gauge once per code (issue 19:
    1.7-5 s at 2,048 nodes for ``GpuFatalXid``); this selects it once.
    """
    wanted = sorted(set(codes))
    if not wanted:
        raise ValueError("no codes")
    lo, hi = wanted[0], wanted[-1]
    span = f"{metric} == {lo}" if lo == hi else f"{metric} >= {lo} <= {hi}"
    gaps = " ".join(f"!= {n}" for n in range(lo, hi + 1) if n not in set(wanted))
    return f"{span} {gaps}".strip()


def render_label_regex(codes: Iterable[int]) -> str:
    """A label regex matching exactly ``codes`` (for ``DCGM_EXP_XID_ERRORS_COUNT{xid=~"..."}``)."""
    return "|".join(str(c) for c in sorted(set(codes)))
