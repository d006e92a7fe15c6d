"""The log bundle the agent captures before a reboot wipes the node's logs, or for a ticket.

The agent captures it before a ladder reboot and, when healer quarantines the node, for a
``capture`` request (so a replacement ticket not preceded by a reboot carries it too).

Three parts, each capped (the newest kept where a part is cut, and the cut said in the text):

* the kernel log since boot (``/dev/kmsg``, as far as its ring buffer reaches): the last
  :data:`KERNEL_LOG_MAX_BYTES`;
* the NVIDIA driver's Xid lines from it: the last :data:`XID_LINES_MAX_BYTES`;
* ``nvidia-smi -q`` (``repair.agent_bundle_command``; through ``nsenter`` in the chart), where
  present: the first :data:`NVIDIA_SMI_MAX_BYTES`, within :data:`NVIDIA_SMI_TIMEOUT_SECONDS`.

It travels in the agent's answer (the Node annotation ``<domain>/repair-result``, field
``bundle``) as gzip then base64, at most :data:`ENCODED_MAX_BYTES` (the kernel log part is halved
until it fits: Kubernetes caps all of an object's annotations together at 256 KiB). The controller
keeps it in the repair (or capture) step's evidence and the replacement ticket that follows
carries the latest (``log_bundle`` in the payload, docs/tickets.md).
"""

from __future__ import annotations

import base64
import gzip
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from healer.model.repair import CAPTURE, RepairRequest
from healer.nodeagent.kmsg import KmsgRecord, KmsgSource, parse_xid

KERNEL_LOG_MAX_BYTES = 192 * 1024
XID_LINES_MAX_BYTES = 16 * 1024
NVIDIA_SMI_MAX_BYTES = 48 * 1024
NVIDIA_SMI_TIMEOUT_SECONDS = 30.0
#: The bundle in the annotation, gzip + base64: a quarter of what one object's annotations may hold.
ENCODED_MAX_BYTES = 64 * 1024

Runner = Callable[[Sequence[str], float], tuple[int, str]]


def bundle_reason(request: RepairRequest) -> str:
    """What the bundle is captured before, for its first line: ``reboot for incident 12``, or
    ``the ticket for incident 12`` for a capture."""
    if request.action == CAPTURE:
        return f"the ticket for incident {request.incident}"
    return f"{request.action} for incident {request.incident}"


def run_command(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    """Run ``argv``; (exit status, stdout and stderr). Raises OSError or subprocess.TimeoutExpired."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    return done.returncode, done.stdout + done.stderr


def _tail(lines: Sequence[str], limit: int) -> tuple[list[str], int]:
    """The last lines that fit in ``limit`` bytes, and how many were left out."""
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line.encode()) + 1
        if size > limit:
            break
        kept.append(line)
    return kept[::-1], len(lines) - len(kept)


def _section(title: str, lines: Sequence[str], left_out: int, *, where: str = "earlier") -> list[str]:
    head = f"=== {title} ==="
    cut = [f"... {left_out} {where} lines left out (size cap)"] if left_out else []
    return [head, *cut, *lines, ""] if where == "earlier" else [head, *lines, *cut, ""]


@dataclass(frozen=True)
class LogBundle:
    """The bundle's text and whether any part was cut to fit."""

    text: str
    truncated: bool

    def encode(self) -> str:
        """gzip, then base64 (ASCII); :func:`healer.model.repair.decode_bundle` reads it back."""
        return base64.b64encode(gzip.compress(self.text.encode(), mtime=0)).decode()


@dataclass(frozen=True)
class Capture:
    """What to capture: the bundle of ``node`` at ``at`` (RFC 3339), because of ``why`` (e.g.
    "reboot for incident 12"), from the kernel log ``kmsg`` and the command ``nvidia_smi`` (run by
    ``runner``). A part that cannot be read says why in its place; nothing here raises."""

    node: str
    why: str
    kmsg: KmsgSource | None
    nvidia_smi: Sequence[str] | None
    at: str
    runner: Runner = run_command

    def _kernel_log(self) -> tuple[list[KmsgRecord], str]:
        if self.kmsg is None:
            return [], "(no kernel log source)"
        try:
            return self.kmsg.read_all(), ""
        except OSError as exc:
            return [], f"(cannot read {self.kmsg.name}: {exc.strerror or exc})"

    def _command(self) -> tuple[list[str], int]:
        """The command's output lines and how many were cut."""
        if not self.nvidia_smi:
            return ["(not configured: repair.agent_bundle_command)"], 0
        try:
            status, output = self.runner(self.nvidia_smi, NVIDIA_SMI_TIMEOUT_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [f"(not run: {self.nvidia_smi[0]}: {exc})"], 0
        data = output.encode()
        cut = data[NVIDIA_SMI_MAX_BYTES:].count(b"\n") + 1 if len(data) > NVIDIA_SMI_MAX_BYTES else 0
        if cut:
            output = data[:NVIDIA_SMI_MAX_BYTES].decode("utf-8", "ignore")
        return [*output.splitlines(), f"(exit {status})"], cut

    def bundle(self, *, kernel_log_max: int = KERNEL_LOG_MAX_BYTES) -> LogBundle:
        """The bundle, its kernel log part at most ``kernel_log_max`` bytes."""
        records, kernel_note = self._kernel_log()
        log_lines, log_cut = _tail([r.line() for r in records], kernel_log_max)
        xids = [r.line() for r in records if parse_xid(r) is not None]
        xid_lines, xid_cut = _tail(xids, XID_LINES_MAX_BYTES)
        smi_lines, smi_cut = self._command()
        command = " ".join(self.nvidia_smi or ["nvidia-smi", "-q"])
        text = "\n".join(
            [
                f"healer log bundle: node {self.node}, captured {self.at} before {self.why}",
                "",
                *_section(
                    f"kernel log since boot ({len(records)} records) {kernel_note}".rstrip(),
                    log_lines,
                    log_cut,
                ),
                *_section(f"NVIDIA driver Xid lines ({len(xids)})", xid_lines, xid_cut),
                *_section(command, smi_lines, smi_cut, where="later"),
            ]
        )
        return LogBundle(text=text, truncated=bool(log_cut or xid_cut or smi_cut))

    def encoded(self) -> str:
        """The bundle, encoded, its kernel log halved until the encoding fits in
        :data:`ENCODED_MAX_BYTES` (empty when even without it it does not)."""
        limit = KERNEL_LOG_MAX_BYTES
        while True:
            encoded = self.bundle(kernel_log_max=limit).encode()
            if len(encoded) <= ENCODED_MAX_BYTES:
                return encoded
            if limit < 1024:
                return ""
            limit //= 2
