"""How the node agent carries out a repair: commands on the node (default) or another executor.

:class:`CommandExecutor` runs one command per action (``nvidia-smi -r -i <gpu>`` for a GPU reset,
``systemctl reboot`` for a reboot; configurable in ``repair.agent_commands``, ``{gpu}`` replaced
by the GPU index); exit status 0 is success. ``repair.agent_executor`` names another executor as
``module:factory`` (a callable taking the settings and returning an :class:`Executor`), e.g. one
that asks a cloud provider's API to reboot the instance.
"""

from __future__ import annotations

import importlib
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from healer.config import Settings
from healer.errors import ConfigError
from healer.model.repair import RepairRequest


@dataclass(frozen=True)
class Outcome:
    """What an action did: ``ok`` and its output (trimmed, for the record)."""

    ok: bool
    output: str = ""


class Executor(Protocol):
    """Carries out a verified request on this node."""

    def run(self, request: RepairRequest) -> Outcome: ...


@dataclass(frozen=True)
class CommandExecutor:
    """Runs ``commands[action]`` (argv, ``{gpu}`` substituted); exit 0 = ok. ``timeout_seconds``
    per command."""

    commands: Mapping[str, Sequence[str]]
    timeout_seconds: float = 300.0

    def run(self, request: RepairRequest) -> Outcome:
        argv = self.commands.get(request.action)
        if not argv:
            return Outcome(False, f"no command configured for {request.action}")
        args = [part.replace("{gpu}", request.gpu or "") for part in argv]
        try:
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=self.timeout_seconds, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Outcome(False, f"{args[0]}: {exc}")
        output = (done.stdout + done.stderr).strip()[-2000:]
        return Outcome(
            done.returncode == 0, f"exit {done.returncode}: {output}" if output else f"exit {done.returncode}"
        )


def load_executor(settings: Settings) -> Executor:
    """The executor the settings name (``repair.agent_executor``), else the commands."""
    spec = settings.repair.agent_executor
    if not spec:
        return CommandExecutor(settings.repair.agent_commands, settings.repair.agent_command_timeout_seconds)
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"repair.agent_executor {spec!r}: {exc}") from None
    executor: Executor = factory(settings)
    return executor
