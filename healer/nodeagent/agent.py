"""The node agent: watch one Node, verify the controller's repair request, carry it out, answer.

Runs as a DaemonSet (the chart's ``agent.enabled``, off by default), one per node, with the node
name from the downward API. It watches only its own Node (``fieldSelector=metadata.name=<node>``);
a request in ``<domain>/repair-request`` is verified (:func:`healer.model.repair.verify`:
signature, node name, expiry, nonce not answered before, known action) and carried out through an
:class:`~healer.nodeagent.executor.Executor`; the answer goes to ``<domain>/repair-result``
(``succeeded``, ``failed`` or ``refused`` with the reason; every refusal is logged with it).

A reboot is answered ``succeeded`` ("reboot started") before the command runs, since the agent
does not outlive it; the answer carries the log bundle captured just before
(:mod:`healer.nodeagent.bundle`: the kernel log since boot, its Xid lines, ``nvidia-smi -q``),
which a reboot would wipe; the validation after the repair is what proves the node healthy. The answered
nonce is read back from the Node on start, so an agent restarted by the reboot does not run the
same request twice.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from healer.clock import utc_now
from healer.model.repair import (
    CAPTURE,
    Refused,
    RepairRequest,
    RepairResult,
    request_key,
    result_key,
    verify,
)
from healer.nodeagent.executor import Executor

log = logging.getLogger(__name__)


@dataclass
class NodeAgent:
    """The agent of ``node``: ``core`` is a CoreV1Api as the agent's ServiceAccount."""

    core: k8s.CoreV1Api
    node: str
    domain: str
    secret: bytes
    executor: Executor
    clock: Callable[[], datetime] = utc_now
    #: Captures the log bundle before a reboot or a GPU reset, or for a capture (gzip + base64;
    #: "" when none): request → bundle.
    bundler: Callable[[RepairRequest], str] | None = None
    request_timeout_seconds: float = 10.0
    answered: set[str] = field(default_factory=set)  # nonces answered
    handled: set[str] = field(default_factory=set)  # sha256 of raw requests handled (refused ones too)

    def handle(self, annotations: dict[str, str]) -> RepairResult | None:
        """Act on the request in ``annotations`` (the Node's), once; the answer written, or None
        when there is nothing new to do."""
        raw = annotations.get(request_key(self.domain))
        if not raw:
            return None
        digest = hashlib.sha256(raw.encode()).hexdigest()
        previous = RepairResult.parse(annotations.get(result_key(self.domain)))
        if previous is not None and previous.nonce:
            self.answered.add(previous.nonce)
        if digest in self.handled:
            return None
        self.handled.add(digest)
        now = self.clock()
        try:
            request = verify(
                raw, secret=self.secret, node=self.node, now=now, seen_nonces=frozenset(self.answered)
            )
        except Refused as exc:
            if previous is not None and exc.nonce and previous.nonce == exc.nonce and "replay" in exc.reason:
                return None  # our own answer to this request, read back (e.g. after a restart)
            log.warning("node %s: repair request refused: %s", self.node, exc.reason)
            result = RepairResult(
                nonce=exc.nonce or "", status="refused", reason=exc.reason, at=now.isoformat()
            )
            self._answer(result)
            return result
        self.answered.add(request.nonce)
        log.info(
            "node %s: %s%s requested (incident %s, nonce %s)",
            self.node,
            request.action,
            f" GPU {request.gpu}" if request.gpu else "",
            request.incident,
            request.nonce,
        )
        if request.action == CAPTURE:
            bundle = self._bundle(request)
            log.info("node %s: log bundle captured for the ticket (%d bytes)", self.node, len(bundle))
            result = RepairResult(
                request.nonce,
                "succeeded" if bundle else "failed",
                "log bundle captured" if bundle else "no log bundle captured",
                now.isoformat(),
                bundle=bundle,
            )
            self._answer(result)
            return result
        if request.action == "reboot":
            bundle = self._bundle(request)
            if bundle:
                log.info("node %s: log bundle captured before the reboot (%d bytes)", self.node, len(bundle))
            result = RepairResult(
                request.nonce, "succeeded", "reboot started", now.isoformat(), bundle=bundle
            )
            self._answer(result)
            self.executor.run(request)
            return result
        # A GPU reset's answer carries a bundle too, captured before the reset: the request that
        # asks for it can replace the quarantine's capture request on the Node before this agent
        # read that one (one request annotation per node), and the ticket after a failed reset
        # would go without any.
        bundle = self._bundle(request) if request.action == "reset-gpu" else ""
        outcome = self.executor.run(request)
        result = RepairResult(
            nonce=request.nonce,
            status="succeeded" if outcome.ok else "failed",
            reason=f"{request.action} {'done' if outcome.ok else 'failed'}",
            at=self.clock().isoformat(),
            output=outcome.output,
            bundle=bundle,
        )
        self._answer(result)
        return result

    def _bundle(self, request: RepairRequest) -> str:
        """The log bundle for ``request`` from :attr:`bundler` ("" without one)."""
        return self.bundler(request) if self.bundler is not None else ""

    def _answer(self, result: RepairResult) -> None:
        body = {"metadata": {"annotations": {result_key(self.domain): result.encode()}}}
        self.core.patch_node(self.node, body, _request_timeout=self.request_timeout_seconds)

    def once(self) -> RepairResult | None:
        """Read the Node and handle its request (one pass; the watch loop calls :meth:`handle`)."""
        node = self.core.read_node(self.node, _request_timeout=self.request_timeout_seconds)
        meta = node.metadata
        return self.handle(dict((meta.annotations if meta else None) or {}))

    def watch(self, stop: threading.Event, *, timeout_seconds: int = 60) -> None:
        """Watch the Node until ``stop`` is set, handling each change (re-listing after errors)."""
        selector = f"metadata.name={self.node}"
        while not stop.is_set():
            try:
                self.once()
                w = k8s_watch.Watch()
                for event in w.stream(
                    self.core.list_node, field_selector=selector, timeout_seconds=timeout_seconds
                ):
                    obj = event["object"]
                    if obj.metadata.name == self.node:
                        self.handle(dict(obj.metadata.annotations or {}))
                    if stop.is_set():
                        w.stop()
                        break
            except ApiException as exc:
                log.warning("node %s: watch failed (%s): retrying", self.node, exc.status)
                stop.wait(2.0)
