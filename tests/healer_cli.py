"""The ``healer`` command as a user runs it: a separate process, settings from the environment."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def run_healer(*args: str, env: Mapping[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``healer ARGS`` with exactly ``env``; its exit status and output, whatever they are."""
    # The interpreter running the tests, so it works outside an activated virtual environment.
    return subprocess.run(
        [sys.executable, "-m", "healer", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
