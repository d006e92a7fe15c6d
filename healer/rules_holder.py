"""The rule set in force for a running controller, reloaded on file change or SIGHUP.

A bad reload keeps the previous rule set running and is recorded (``switches.ruleset``) so the
dashboard's Rules page shows why it was rejected.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from healer.ruleset.device_filter import ALL_DEVICES, DeviceFilter
from healer.ruleset.loading import RULE_FILE_SUFFIXES, load_ruleset, reload_ruleset
from healer.ruleset.schema import RuleSet
from healer.store import nodes as repo
from healer.store.session import transaction

log = logging.getLogger(__name__)


#: Characters of a rejected reload's error kept for the Rules page (every problem is also logged).
MAX_RECORDED_ERROR = 8000


def _fingerprint(paths: Sequence[Path]) -> tuple[tuple[str, float, int], ...]:
    """(file, mtime, size) of every rule file; a file that vanishes meanwhile is simply left out."""
    found: list[tuple[str, float, int]] = []
    for path in paths:
        try:
            files = (
                sorted(p for p in path.iterdir() if p.suffix in RULE_FILE_SUFFIXES)
                if path.is_dir()
                else [path]
            )
        except OSError:
            files = []
        for file in files:
            try:
                st = file.stat()
            except OSError:
                continue
            found.append((str(file), st.st_mtime, st.st_size))
    return tuple(found)


def _clip(error: str) -> str:
    if len(error) <= MAX_RECORDED_ERROR:
        return error
    return (
        error[:MAX_RECORDED_ERROR] + f"\n... ({len(error) - MAX_RECORDED_ERROR} more characters in the log)"
    )


class RulesHolder:
    """Holds the current :class:`RuleSet`; thread-safe.

    Args:
        paths: rule files or directories (``settings.rules_paths``).
        session_factory: where a reload's outcome is recorded (None: not recorded).
        clock: aware UTC now.
        transform: applied to every loaded set (the demo shortens ``for`` with it).
        device_filter: the settings' InfiniBand device filter, written into every load and reload.
        recording_rules: accept Prometheus recording rules (alerts mode; see
            :func:`~healer.ruleset.loading.validate_rules`).

    Raises (constructor):
        RuleError: the initial load failed; the controller does not start on bad rules.
    """

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        session_factory: sessionmaker[Session] | None,
        clock: Callable[[], datetime],
        transform: Callable[[RuleSet], RuleSet] = lambda rs: rs,
        device_filter: DeviceFilter = ALL_DEVICES,
        recording_rules: bool = False,
    ) -> None:
        self.paths = list(paths)
        self._recording_rules = recording_rules
        self._sessions = session_factory
        self._clock = clock
        self._transform = transform
        self._lock = threading.Lock()
        self._requested = threading.Event()
        self._fingerprint = _fingerprint(self.paths)
        self._device_filter = device_filter
        self._ruleset = transform(
            load_ruleset(self.paths, recording_rules=recording_rules, device_filter=device_filter)
        )
        self._record(error=None)

    @property
    def ruleset(self) -> RuleSet:
        with self._lock:
            return self._ruleset

    def reload(self, *, reason: str = "reload") -> bool:
        """Load the files again; True when the new set is in force, False when it was rejected."""
        # Validation (promtool included) runs outside the lock: a tick reading the rule set
        # meanwhile gets the current one instead of waiting.
        self._fingerprint = _fingerprint(self.paths)  # a rejected set is retried on the next change
        try:
            result = reload_ruleset(
                self.paths,
                self.ruleset,
                recording_rules=self._recording_rules,
                device_filter=self._device_filter,
            )
        except Exception as exc:  # untrusted files: whatever they do, the old rules keep running
            log.exception("rules reload failed (%s); the previous rule set keeps running", reason)
            self._record(error=f"reload failed: {type(exc).__name__}: {exc}")
            return False
        if result.ok:
            with self._lock:
                self._ruleset = self._transform(result.ruleset)
            log.info("rules reloaded (%s): %d rules", reason, len(result.ruleset.rules))
        else:
            log.error(
                "rules reload rejected (%s); the previous rule set keeps running: %s", reason, result.error
            )
        self._record(error=None if result.ok else str(result.error))
        return result.ok

    def request_reload(self) -> None:
        """Ask for a reload at the next :meth:`reload_if_changed` (safe from a signal handler)."""
        self._requested.set()

    def reload_if_changed(self) -> bool | None:
        """Reload when asked to or when a rule file changed since the last load; None when neither."""
        if self._requested.is_set():
            self._requested.clear()
            return self.reload(reason="SIGHUP")
        if _fingerprint(self.paths) == self._fingerprint:
            return None
        return self.reload(reason="file changed")

    def _record(self, *, error: str | None) -> None:
        if self._sessions is None:
            return
        now = self._clock()
        with transaction(self._sessions) as session:
            row = repo.get_switch(session, repo.SWITCH_RULESET)
            if error is None:
                row = {
                    "loaded_at": now.isoformat(),
                    "sources": [str(p) for p in self.paths],
                    "rules": len(self._ruleset.rules),
                    "rejected": [],
                }
            else:
                row.setdefault("rejected", []).append({"error": _clip(error), "at": now.isoformat()})
                row["rejected"] = row["rejected"][-5:]
            repo.set_switch(session, repo.SWITCH_RULESET, row, now=now, by="healer")
