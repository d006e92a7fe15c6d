"""The demo runs the default rule pack with hold times and range windows scaled down, nothing else."""

from __future__ import annotations

from healer.ruleset.loading import load_ruleset
from healer_dev.demo import scale_holds
from tests.conftest import REPO


def test_scaled_pack_keeps_rules_and_shortens_holds_and_windows() -> None:
    pack = load_ruleset([REPO / "rules"], promtool=False)
    scaled = scale_holds(pack, 0.1)
    assert [r.name for r in scaled.rules] == [r.name for r in pack.rules]
    hot = scaled.rule("GpuTooHot")
    assert hot.for_ == pack.rule("GpuTooHot").for_ * 0.1
    assert hot.keep_firing_for == pack.rule("GpuTooHot").keep_firing_for * 0.1
    assert "[10m]" in pack.rule("NvlinkErrorBurst").expr
    assert "[10m]" not in scaled.rule("NvlinkErrorBurst").expr
    assert "[60s]" in scaled.rule("NvlinkErrorBurst").expr
    assert all(g.interval is not None and g.interval <= 5 for g in scaled.groups)
    # Actions are untouched.
    assert hot.actions == pack.rule("GpuTooHot").actions
