"""The log bundle the agent captures before a reboot (issue 32): what it holds, its caps, bad input."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from healer.model.repair import RepairResult, decode_bundle
from healer.nodeagent.bundle import (
    ENCODED_MAX_BYTES,
    KERNEL_LOG_MAX_BYTES,
    NVIDIA_SMI_MAX_BYTES,
    Capture,
    Runner,
)
from healer.nodeagent.kmsg import KmsgFile
from healer_dev.agent_fixture import AgentFixture, write_fixture

AT = "2026-12-04T03:00:00+00:00"
SMI = ["nvidia-smi", "-q"]


def smi(output: str, status: int = 0) -> Runner:
    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        assert list(argv) == SMI and timeout > 0
        return status, output

    return run


@pytest.fixture
def node(tmp_path: Path) -> AgentFixture:
    fixture = write_fixture(tmp_path / "node", gpus=8, hcas=0)
    fixture.log("mlx5_core 0000:c1:00.0: Port module event: module 0, Cable unplugged", usec=3_000_000_000)
    fixture.log_xid(3, 79, "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", usec=3_500_000_000)
    return fixture


def test_the_bundle_holds_the_kernel_log_its_xid_lines_and_nvidia_smi(node: AgentFixture) -> None:
    output = "==============NVSMI LOG==============\nDriver Version : 570.133.20\n"
    bundle = Capture(
        "gpu-node-3", "reboot for incident 12", KmsgFile(node.kmsg), SMI, AT, smi(output)
    ).bundle()
    text = bundle.text
    assert text.startswith(
        f"healer log bundle: node gpu-node-3, captured {AT} before reboot for incident 12\n"
    )
    assert "=== kernel log since boot (4 records) ===\n[    0.000000] Linux version" in text
    assert "[ 3000.000000] mlx5_core 0000:c1:00.0: Port module event: module 0, Cable unplugged" in text
    xids = text.split("=== NVIDIA driver Xid lines (1) ===\n")[1].split("\n\n")[0]
    assert xids == (
        "[ 3500.000000] NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus."
    )
    assert (
        "=== nvidia-smi -q ===\n==============NVSMI LOG==============\nDriver Version : 570.133.20\n(exit 0)"
        in text
    )
    assert not bundle.truncated
    assert decode_bundle(bundle.encode()) == text


def test_each_part_is_capped_and_the_cut_is_said(node: AgentFixture) -> None:
    for i in range(4000):  # ~400 KiB of kernel log
        node.log(
            f"usb 1-{i}: new high-speed USB device number {i} using xhci_hcd " + "x" * 40,
            usec=4_000_000_000 + i,
        )
    capture = Capture(
        "n", "reboot", KmsgFile(node.kmsg), SMI, AT, smi("line of nvidia-smi -q output\n" * 5000)
    )
    bundle = capture.bundle()
    assert bundle.truncated
    kernel = bundle.text.split("=== NVIDIA driver Xid lines")[0]
    assert len(kernel.encode()) <= KERNEL_LOG_MAX_BYTES + 200
    assert "earlier lines left out (size cap)" in kernel
    assert "using xhci_hcd" in kernel.splitlines()[-2]  # the newest kept
    assert "GPU has fallen off the bus" in bundle.text  # the Xid lines have their own part
    smi_part = bundle.text.split("=== nvidia-smi -q ===\n")[1]
    assert len(smi_part.encode()) <= NVIDIA_SMI_MAX_BYTES + 200
    assert "later lines left out (size cap)" in smi_part
    # In the answer: gzip + base64 within its cap, the kernel log halved until it fits.
    encoded = capture.encoded()
    assert 0 < len(encoded) <= ENCODED_MAX_BYTES
    assert "using xhci_hcd" in decode_bundle(encoded)


def test_what_cannot_be_read_is_said_in_its_place(tmp_path: Path) -> None:
    def missing(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    bundle = Capture("n", "reboot", KmsgFile(tmp_path / "no-kmsg"), SMI, AT, missing).bundle()
    assert "=== kernel log since boot (0 records) (cannot read " in bundle.text
    assert "No such file or directory)" in bundle.text
    assert "(not run: nvidia-smi: [Errno 2] No such file or directory: 'nvidia-smi')" in bundle.text
    unconfigured = Capture("n", "reboot", kmsg=None, nvidia_smi=[], at=AT).bundle()
    assert "(not configured: repair.agent_bundle_command)" in unconfigured.text


def test_the_answer_carries_the_bundle_and_a_bad_one_is_dropped_not_fatal() -> None:
    encoded = Capture("n", "reboot", kmsg=None, nvidia_smi=[], at=AT).encoded()
    answer = RepairResult("7-0-2", "succeeded", "reboot started", AT, bundle=encoded)
    assert RepairResult.parse(answer.encode()) == answer
    assert '"bundle"' not in RepairResult("7-0-2", "succeeded").encode()  # as before when none
    oversized = RepairResult("7-0-2", "succeeded", bundle="A" * 200_000).encode()
    parsed = RepairResult.parse(oversized)
    assert parsed is not None and parsed.bundle == "" and parsed.status == "succeeded"
    with pytest.raises(ValueError, match="not a log bundle"):
        decode_bundle("not base64!")
