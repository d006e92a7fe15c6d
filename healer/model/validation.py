"""The validation Job's outcome: pod exit code and one JSON result line. Pure.

healer runs a Job pinned to the repaired node before it returns (``healer.actions.validation``).
Its container writes one JSON line as its termination message (``terminationMessagePolicy:
FallbackToLogsOnError`` and ``/dev/termination-log``), e.g.
``{"dcgm_level": 2, "passed": true, "nccl_busbw_gbps": 182.4}``; healer reads it from the pod's
``status.containerStatuses[].state.terminated.message`` rather than from the logs (KWOK pods have
no logs, and the message survives the pod's logs being rotated). Exit code 0 and a result whose
``passed`` is not false mean success; no JSON result line fails (a Job must say it passed: KWOK
completes Job pods with exit 0 and no message), and so does an NCCL bandwidth under
``nccl_min_busbw_gbps``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ValidationResult:
    """``status``: ``running`` | ``succeeded`` | ``failed``; ``result`` the parsed JSON line."""

    status: str
    exit_code: int | None = None
    result: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    def evidence(self) -> dict[str, Any]:
        """JSON-safe, for the transition's evidence."""
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "result": self.result,
            "message": self.message[:2000],
        }


def judge(
    phase: str | None, exit_code: int | None, message: str | None, *, nccl_min_busbw_gbps: float | None = None
) -> ValidationResult:
    """The outcome of a validation pod in ``phase`` whose container ended with ``exit_code`` and
    termination ``message`` (its last line is the JSON result)."""
    text = (message or "").strip()
    if phase not in ("Succeeded", "Failed") and exit_code is None:
        return ValidationResult("running", message=text)
    result: dict[str, Any] = {}
    line = text.splitlines()[-1] if text else ""
    try:
        parsed = json.loads(line) if line else {}
        if isinstance(parsed, dict):
            result = parsed
    except ValueError:
        pass
    if not result:
        return ValidationResult(
            "failed", exit_code=exit_code, result={"why": "no JSON result line"}, message=text
        )
    ok = exit_code == 0 and result.get("passed") is not False
    bandwidth = result.get("nccl_busbw_gbps")
    if (
        ok
        and nccl_min_busbw_gbps is not None
        and isinstance(bandwidth, int | float)
        and bandwidth < nccl_min_busbw_gbps
    ):
        ok = False
        result = {**result, "why": f"NCCL bus bandwidth {bandwidth} GB/s under {nccl_min_busbw_gbps} GB/s"}
    return ValidationResult("succeeded" if ok else "failed", exit_code=exit_code, result=result, message=text)
